{
  description = "mok: mixture-of-experts layer (PyTorch + a CUDA extension) - contributor shell";

  # One nixpkgs, pinned by rev and narHash in flake.lock.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixpkgs-unstable";

  outputs =
    { self, nixpkgs }:
    let
      system = "x86_64-linux";
      pkgs = import nixpkgs {
        inherit system;
        # NVIDIA's CUDA redistributables are unfree.
        config.allowUnfree = true;
      };
      inherit (pkgs) lib;

      # The versions every front end must agree on are read from the repository itself, so this
      # shell refuses to evaluate when nixpkgs drifts from them instead of building something else.
      extension = builtins.readFile ./tools/build/extension.bzl;
      nvccVersion = builtins.head (builtins.match ''.*CUDA_VERSION = "([0-9.]+)".*'' extension);
      pythonVersion = lib.removePrefix ">=" (lib.importTOML ./pyproject.toml).project.requires-python;
      bazelVersion = lib.fileContents ./.bazelversion;

      cuda = pkgs.cudaPackages_13_0;
      python = pkgs.python312;
      bazel = pkgs.bazel_8;
    in
    assert lib.assertMsg (cuda.cuda_nvcc.version == nvccVersion)
      "cudaPackages_13_0 has nvcc ${cuda.cuda_nvcc.version}; tools/build/extension.bzl pins ${nvccVersion}";
    assert lib.assertMsg (lib.versions.majorMinor python.version == pythonVersion)
      "python312 is ${python.version}; pyproject.toml requires ${pythonVersion}";
    # Bazel's launcher runs the version .bazelversion names, and nixpkgs ships exactly one.
    assert lib.assertMsg (bazel.version == bazelVersion)
      "nixpkgs bazel_8 is ${bazel.version}; .bazelversion says ${bazelVersion}";
    {
      # nvcc accepts only some host compilers; backendStdenv is the one nixpkgs pairs with it.
      devShells.${system}.default = (pkgs.mkShell.override { stdenv = cuda.backendStdenv; }) {
        packages = [
          bazel
          pkgs.bazel-buildtools # buildifier, buildozer
          pkgs.ruff
          pkgs.uv
          pkgs.nodejs # npm ci: the buildifier that tools/check_build_files.sh pins
          python
          cuda.cuda_nvcc
          cuda.cuda_cudart
          cuda.cuda_cccl
        ];
        CUDA_HOME = "${cuda.cuda_nvcc}";
        # The Python dependencies (torch, the PyPI nvcc the PEP 517 build uses, ...) come from the
        # one lock file, not from nixpkgs: `uv venv && uv pip sync requirements.lock`.
        UV_PYTHON = "${python}/bin/python3";
        UV_PYTHON_DOWNLOADS = "never";
        shellHook = ''
          echo "mok dev shell: nvcc ${cuda.cuda_nvcc.version}, Python ${python.version}, Bazel ${bazel.version}"
        '';
      };
    };
}
