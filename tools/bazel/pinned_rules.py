"""What the pinned Bazel rule sets define: every rule, macro and module-extension tag our
Bazel files may use, with the attributes that version accepts, and where each list was read.

tools/bazel/check_starlark.py rejects a call to anything not listed here and any attribute not
listed for it. The lists are for the versions in PINNED_MODULES; bumping a version in MODULE.bazel
fails the check until the lists are re-read from the new release and PINNED_MODULES is updated.
"""

from __future__ import annotations

from dataclasses import dataclass

# Module versions these tables were read from (the Bazel Central Registry's newest at the time).
PINNED_MODULES = {
    "bazel_skylib": "1.9.2",
    "buildifier_prebuilt": "8.2.1.2",
    "platforms": "1.1.0",
    "pybind11_bazel": "3.0.1",
    "rules_cc": "0.2.17",
    "rules_cuda": "0.3.0",
    "rules_python": "2.3.2",
}

# The CUDA redistributable releases we may pin, with the cuda_nvcc / cuda_cudart / cuda_cccl
# versions their redistrib JSON lists (read from the copy of redistrib_13.0.2.json kept in
# NixOS/nixpkgs pkgs/development/cuda-modules/_cuda/manifests/cuda/; the JSON's sha256
# fce66717...d71c2 is the one google-ml-infra/rules_ml_toolchain gpu/cuda/cuda_redist_versions.bzl
# records for redistrib_13.0.2.json).
CUDA_REDIST_COMPONENTS = {
    "13.0.2": {"cuda_nvcc": "13.0.88", "cuda_cudart": "13.0.96", "cuda_cccl": "13.0.85"},
}


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Bazel 8 Build Encyclopedia, "Common definitions" (bazel.build/versions/7.7.1 and 9.1.0
# reference/be/common-definitions; the 8.x pages list the same set).
COMMON = _words(
    "name compatible_with deprecation exec_compatible_with exec_properties features "
    "restricted_to tags target_compatible_with testonly toolchains visibility aspect_hints"
)
TEST_COMMON = _words("args env env_inherit size timeout flaky shard_count local")
BINARY_COMMON = _words("args env output_licenses")


@dataclass(frozen=True)
class Rule:
    """A callable a Bazel file may load: its attributes, required attributes and the source read."""

    attrs: frozenset[str]
    source: str
    mandatory: frozenset[str] = frozenset()
    label_attrs: frozenset[str] = frozenset()


def _attrs(*groups: frozenset[str] | str) -> frozenset[str]:
    names: set[str] = set()
    for group in groups:
        names |= set(group.split()) if isinstance(group, str) else group
    return frozenset(names)


_LABELS = _words("srcs hdrs data deps main requirements_lock")

# rules_python 2.3.2: python/private/attributes.bzl (COMMON_ATTRS, PY_SRCS_ATTRS, IMPORTS_ATTRS,
# precompile attrs, executable "env"/"stamp", test "env_inherit") and py_executable.bzl.
_PY_COMMON = "data deps imports srcs srcs_version distribs licenses pyi_deps pyi_srcs precompile "
_PY_COMMON += "precompile_invalidation_mode precompile_optimize_level precompile_source_retention"
_PY_EXEC = (
    "interpreter_args legacy_create_init main main_module pyc_collection python_version stamp"
)

# Bazel 8.3 Build Encyclopedia, C / C++ rules (bazel.build/versions/8.3.0/reference/be/c-cpp).
_CC_BINARY = (
    "deps srcs data additional_linker_inputs conlyopts copts cxxopts defines dynamic_deps "
    "hdrs_check includes licenses link_extra_lib linkopts linkshared linkstatic local_defines "
    "malloc module_interfaces nocopts reexport_deps stamp win_def_file distribs"
)
_CC_LIBRARY = (
    "deps srcs data hdrs additional_linker_inputs alwayslink conlyopts copts cxxopts defines "
    "hdrs_check implementation_deps include_prefix includes licenses linkopts linkstamp "
    "linkstatic local_defines module_interfaces strip_include_prefix textual_hdrs win_def_file"
)

RULES: dict[tuple[str, str], Rule] = {
    ("@rules_python//python:py_library.bzl", "py_library"): Rule(
        _attrs(COMMON, _PY_COMMON, "experimental_venvs_site_packages namespace_package_files"),
        "rules_python 2.3.2 python/private/py_library.bzl LIBRARY_ATTRS + attributes.bzl",
        label_attrs=_LABELS,
    ),
    ("@rules_python//python:py_test.bzl", "py_test"): Rule(
        _attrs(COMMON, TEST_COMMON, _PY_COMMON, _PY_EXEC),
        "rules_python 2.3.2 python/private/py_test_rule.bzl, py_executable.bzl, attributes.bzl",
        mandatory=frozenset({"srcs"}),
        label_attrs=_LABELS,
    ),
    ("@rules_python//python:packaging.bzl", "py_package"): Rule(
        _attrs(COMMON, "deps packages"),
        "rules_python 2.3.2 python/private/py_package.bzl py_package_lib.attrs",
        label_attrs=_LABELS,
    ),
    # py_wheel is a macro (packaging.bzl) over the py_wheel rule (py_wheel.bzl py_wheel_lib.attrs:
    # _distribution_attrs, _requirement_attrs, _entrypoint_attrs, _other_attrs, config_settings).
    ("@rules_python//python:packaging.bzl", "py_wheel"): Rule(
        _attrs(
            COMMON,
            "twine twine_binary publish_args dist_folder deps abi compress distribution platform "
            "python_tag stamp version extra_requires extra_requires_files requires requires_file "
            "console_scripts entry_points add_path_prefix author author_email classifiers "
            "data_files description_content_type description_file extra_distinfo_files homepage "
            "license project_urls python_requires strip_path_prefixes summary config_settings",
        ),
        "rules_python 2.3.2 python/packaging.bzl py_wheel + python/private/py_wheel.bzl",
        mandatory=frozenset({"distribution", "version"}),
        label_attrs=_LABELS | {"requires_file", "description_file"},
    ),
    ("@rules_cc//cc:cc_library.bzl", "cc_library"): Rule(
        _attrs(COMMON, _CC_LIBRARY),
        "Bazel 8.3 Build Encyclopedia cc_library (rules_cc 0.2.17 re-exports it)",
        label_attrs=_LABELS,
    ),
    # rules_cuda 0.3.0 cuda/private/rules/cuda_library.bzl (public attrs of the rule).
    ("@rules_cuda//cuda:defs.bzl", "cuda_library"): Rule(
        _attrs(
            COMMON,
            "srcs hdrs deps alwayslink rdc includes host_copts host_defines host_local_defines "
            "host_linkopts copts defines local_defines linkopts ptxasopts archs",
        ),
        "rules_cuda v0.3.0 cuda/private/rules/cuda_library.bzl",
        label_attrs=_LABELS,
    ),
    # pybind11_bazel 3.0.1 build_defs.bzl: pybind_extension(name, copts, features, linkopts, tags,
    # deps, **kwargs) forwards kwargs to cc_binary and itself sets linkshared and
    # target_compatible_with, so those two must not be passed.
    ("@pybind11_bazel//:build_defs.bzl", "pybind_extension"): Rule(
        _attrs(COMMON, _CC_BINARY, BINARY_COMMON) - {"linkshared", "target_compatible_with"},
        "pybind11_bazel v3.0.1 build_defs.bzl pybind_extension + cc_binary (Bazel 8.3 docs)",
        label_attrs=_LABELS,
    ),
    # pybind11_bazel 3.0.1 build_defs.bzl: pybind_library(name, copts, features, tags, deps,
    # **kwargs) forwards kwargs to cc_library.
    ("@pybind11_bazel//:build_defs.bzl", "pybind_library"): Rule(
        _attrs(COMMON, _CC_LIBRARY),
        "pybind11_bazel v3.0.1 build_defs.bzl pybind_library + cc_library (Bazel 8.3 docs)",
        label_attrs=_LABELS,
    ),
    # bazel_skylib 1.9.x rules/common_settings.bzl: bool_flag is a build_setting rule (name,
    # build_setting_default, plus the common attributes; scope since 1.8).
    ("@bazel_skylib//rules:common_settings.bzl", "bool_flag"): Rule(
        _attrs(COMMON, "build_setting_default scope"),
        "bazel_skylib 1.9.x rules/common_settings.bzl bool_flag",
        mandatory=frozenset({"build_setting_default"}),
    ),
    # buildifier_prebuilt 8.2.1.2 rules.bzl: buildifier(**kwargs) -> _buildifier with
    # buildifier/factory.bzl buildifier_attr_factory(test_rule = False).
    ("@buildifier_prebuilt//:rules.bzl", "buildifier"): Rule(
        _attrs(
            COMMON,
            "verbose exclude_patterns mode lint_mode lint_warnings diff_command multi_diff "
            "add_tables disabled_rewrites",
        ),
        "buildifier_prebuilt rules.bzl + buildifier/factory.bzl buildifier_attr_factory",
    ),
}

# bazel_skylib 1.9.x lib/paths.bzl: the `paths` struct (read at tag 1.9.1; 1.9.2 is a patch).
VALUES = {
    ("@bazel_skylib//lib:paths.bzl", "paths"): "bazel_skylib 1.9.1 lib/paths.bzl",
}

# Functions Bazel itself provides to BUILD files (and to macros as native.*), Bazel 8 "Functions"
# page (bazel.build/reference/be/functions) and the filegroup / alias / test_suite rules.
NATIVE: dict[str, Rule] = {
    "package": Rule(
        _words(
            "default_applicable_licenses default_visibility default_testonly "
            "default_deprecation default_package_metadata features"
        ),
        "Bazel 8 Build Encyclopedia: package()",
    ),
    "exports_files": Rule(frozenset({"srcs", "visibility", "licenses"}), "Bazel 8: exports_files"),
    "filegroup": Rule(
        _attrs(COMMON, "srcs data output_group"), "Bazel 8: filegroup", label_attrs=_LABELS
    ),
    "alias": Rule(_attrs(COMMON, "actual"), "Bazel 8: alias"),
    "config_setting": Rule(
        _attrs(COMMON, "constraint_values define_values flag_values values"),
        "Bazel 8 Build Encyclopedia: config_setting",
    ),
    "test_suite": Rule(_attrs(COMMON, "tests"), "Bazel 8: test_suite"),
}

# MODULE.bazel globals: Bazel 8 reference, bazel.build/rules/lib/globals/module.
MODULE_FUNCTIONS: dict[str, Rule] = {
    "module": Rule(
        _words("name version compatibility_level repo_name bazel_compatibility"),
        "Bazel 8 globals/module: module()",
    ),
    "bazel_dep": Rule(
        _words("name version max_compatibility_level repo_name dev_dependency"),
        "Bazel 8 globals/module: bazel_dep()",
        mandatory=frozenset({"name", "version"}),
    ),
    "register_toolchains": Rule(frozenset({"dev_dependency"}), "Bazel 8: register_toolchains()"),
}

# Module extensions: (bzl file, extension name) -> tag -> attributes of that tag class.
EXTENSIONS: dict[tuple[str, str], dict[str, Rule]] = {
    # rules_python 2.3.2 python/private/python.bzl tag classes.
    ("@rules_python//python/extensions:python.bzl", "python"): {
        "defaults": Rule(
            _words("pyproject_toml python_version python_version_env python_version_file"),
            "rules_python 2.3.2 python/private/python.bzl _defaults",
        ),
        "toolchain": Rule(
            _words("configure_coverage_tool ignore_root_user_error is_default python_version"),
            "rules_python 2.3.2 python/private/python.bzl _toolchain",
            mandatory=frozenset({"python_version"}),
        ),
    },
    # rules_python 2.3.2 python/private/pypi/extension.bzl _pip_parse_ext_attrs, which merges
    # pypi/pip_repository_attrs.bzl ATTRS, pypi/attrs.bzl ATTRS and the auth attributes.
    ("@rules_python//python/extensions:pip.bzl", "pip"): {
        "parse": Rule(
            frozenset(
                [
                    "experimental_extra_index_urls",
                    "experimental_index_url",
                    "experimental_index_url_overrides",
                    "hub_name",
                    "parallel_download",
                    "pyproject_toml",
                    "python_version",
                    "simpleapi_skip",
                    "target_platforms",
                    "uv_lock",
                    "whl_modifications",
                    "experimental_requirement_cycles",
                    "extra_hub_aliases",
                    "requirements_by_platform",
                    "requirements_darwin",
                    "requirements_linux",
                    "requirements_lock",
                    "requirements_windows",
                    "use_hub_alias_dependencies",
                    "add_libdir_to_library_search_path",
                    "download_only",
                    "enable_implicit_namespace_pkgs",
                    "environment",
                    "envsubst",
                    "extra_pip_args",
                    "isolated",
                    "pip_data_exclude",
                    "python_interpreter",
                    "python_interpreter_target",
                    "quiet",
                    "timeout",
                    "auth_patterns",
                    "netrc",
                ]
            ),
            "rules_python 2.3.2 python/private/pypi/extension.bzl _pip_parse_ext_attrs",
            mandatory=frozenset({"hub_name"}),
            label_attrs=frozenset({"requirements_lock"}),
        ),
        "whl_mods": Rule(
            _words(
                "additive_build_content additive_build_content_file copy_executables copy_files "
                "data data_exclude_glob hub_name srcs_exclude_glob whl_name"
            ),
            "rules_python 2.3.2 python/private/pypi/extension.bzl _whl_mod_attrs",
            mandatory=frozenset({"hub_name", "whl_name"}),
        ),
    },
    # rules_cuda 0.3.0 cuda/extensions.bzl: module_extension "toolchain" and its tag classes.
    ("@rules_cuda//cuda:extensions.bzl", "toolchain"): {
        "redist_json": Rule(
            _words("name components integrity sha256 urls version"),
            "rules_cuda v0.3.0 cuda/extensions.bzl cuda_redist_json_tag",
            mandatory=frozenset({"name"}),
        ),
        "toolkit": Rule(
            _words("name toolkit_path components_mapping version nvcc_version"),
            "rules_cuda v0.3.0 cuda/extensions.bzl cuda_toolkit_tag",
            mandatory=frozenset({"name"}),
        ),
        "component": Rule(
            _words(
                "name component_name descriptive_name integrity sha256 strip_prefix url urls "
                "version"
            ),
            "rules_cuda v0.3.0 cuda/extensions.bzl cuda_component_tag",
            mandatory=frozenset({"name"}),
        ),
    },
}

# rules_cuda 0.3.0 cuda/private/templates/registry.bzl FULL_COMPONENT_NAME keys.
CUDA_COMPONENTS = _words(
    "cudart nvcc nvvm cccl crt culibos cublas cufft cufile cupti curand cusolver cusparse npp "
    "nvidia_fs nvjitlink nvjpeg nvml nvrtc nvtx"
)
