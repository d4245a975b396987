{
  description = "mok: mixture-of-experts layer (PyTorch + a CUDA extension) - dev shell, wheel, checks";

  # One nixpkgs, pinned by rev and narHash in flake.lock.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixpkgs-unstable";

  outputs =
    { self, nixpkgs }:
    let
      # x86_64 hosts and aarch64 Grace hosts (GH200, GB200/GB300 NVL72).
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];

      # The versions every front end must agree on are read from the repository itself, so the
      # flake refuses to evaluate when nixpkgs drifts from them instead of building something else.
      extension = builtins.readFile ./tools/build/extension.bzl;
      nvccVersion = builtins.head (builtins.match ''.*CUDA_VERSION = "([0-9.]+)".*'' extension);
      project = (builtins.fromTOML (builtins.readFile ./pyproject.toml)).project;
      bazelVersion = builtins.head (
        builtins.match "[[:space:]]*([^[:space:]]*)[[:space:]]*" (builtins.readFile ./.bazelversion)
      );

      # Every Python package of requirements.lock, by the lock's own hashes: generated from the lock
      # by tools/nix_wheels.py (tests/cpu/test_nix_flake.py checks that the two agree). torch, the
      # nvidia-* libraries and the CUDA 13.0 compiler wheels the builds use (nvidia-cuda-nvcc ...).
      lockedWheels = import ./nix/wheels.nix;

      perSystem =
        system:
        let
          pkgs = import nixpkgs {
            inherit system;
            # NVIDIA's CUDA redistributables are unfree.
            config.allowUnfree = true;
          };
          inherit (pkgs) lib;
          pythonVersion = lib.removePrefix ">=" project.requires-python;

          cuda = pkgs.cudaPackages_13_0;
          python = pkgs.python312;
          bazel = pkgs.bazel_8;
          wheels = lockedWheels.${system};

          # The locked wheels unpacked into one site-packages directory, as pip would install them:
          # torch's libraries find the nvidia-* ones through RPATHs relative to it. autoPatchelf
          # gives nvcc, ptxas and the libraries Nix's loader; libcuda comes from the driver.
          sitePackages = pkgs.stdenv.mkDerivation {
            pname = "mok-locked-site-packages";
            version = builtins.hashString "sha256" (builtins.readFile ./requirements.lock);
            dontUnpack = true;
            nativeBuildInputs = [
              pkgs.unzip
              pkgs.autoPatchelfHook
            ];
            buildInputs = [
              pkgs.stdenv.cc.cc.lib
              pkgs.zlib
            ];
            autoPatchelfIgnoreMissingDeps = true;
            installPhase = lib.concatMapStrings (wheel: ''
              unzip -qo ${pkgs.fetchurl { inherit (wheel) url sha256; }} -d $out
            '') (lib.attrValues wheels);
          };

          environment = {
            PYTHONPATH = "${sitePackages}";
            LD_LIBRARY_PATH = "${lib.makeLibraryPath [ pkgs.stdenv.cc.cc.lib ]}:/run/opengl-driver/lib";
            # nvcc accepts only some host compilers; backendStdenv's is the one nixpkgs pairs with
            # CUDA 13.0. It is not the release's pinned GCC (extension.bzl HOST_COMPILER_VERSION),
            # so a wheel built here is a contributor's wheel, not the release's bytes.
            MOK_HOST_CXX = "${cuda.backendStdenv.cc}/bin/c++";
          };

          # `nix build`: the wheel, by the PEP 517 backend, with the lock's nvcc.
          wheel = pkgs.stdenvNoCC.mkDerivation (
            environment
            // {
              pname = "mok-wheel";
              inherit (project) version;
              src = lib.cleanSource ./.;
              nativeBuildInputs = [ python ];
              buildPhase = ''
                python -m build --wheel --no-isolation --outdir $out
              '';
              dontInstall = true;
            }
          );

          # `nix flake check`: the CPU suite against that wheel (tools/test_wheel.sh's way).
          cpuTests = pkgs.stdenvNoCC.mkDerivation (
            environment
            // {
              pname = "mok-cpu-tests";
              inherit (project) version;
              src = lib.cleanSource ./.;
              nativeBuildInputs = [ python ];
              buildPhase = ''
                mkdir -p site $out
                python -m zipfile -e ${wheel}/*.whl site
                PYTHONPATH=$PWD/site:$PYTHONPATH python -P -m pytest -q -p no:cacheprovider \
                  --import-mode=importlib tests/cpu | tee $out/pytest.log
              '';
              dontInstall = true;
            }
          );
        in
        assert lib.assertMsg (cuda.cuda_nvcc.version == nvccVersion)
          "cudaPackages_13_0 has nvcc ${cuda.cuda_nvcc.version}; tools/build/extension.bzl pins ${nvccVersion}";
        assert lib.assertMsg (wheels."nvidia-cuda-nvcc".version == nvccVersion)
          "nix/wheels.nix has nvidia-cuda-nvcc ${wheels."nvidia-cuda-nvcc".version}; tools/build/extension.bzl pins ${nvccVersion}";
        assert lib.assertMsg (lib.versions.majorMinor python.version == pythonVersion)
          "python312 is ${python.version}; pyproject.toml requires ${pythonVersion}";
        # Bazel's launcher runs the version .bazelversion names, and nixpkgs ships exactly one.
        assert lib.assertMsg (bazel.version == bazelVersion)
          "nixpkgs bazel_8 is ${bazel.version}; .bazelversion says ${bazelVersion}";
        {
          devShell = pkgs.mkShell (
            environment
            // {
              packages = [
                bazel
                pkgs.bazel-buildtools # buildifier, buildozer
                pkgs.ruff
                pkgs.uv
                pkgs.nodejs # npm ci: the buildifier that tools/check_build_files.sh pins
                pkgs.diffoscope # the lock's diffoscope is an sdist: nixpkgs carries it and its tools
                python
                cuda.cuda_nvcc
              ];
              shellHook = ''
                echo "mok dev shell: nvcc ${nvccVersion} (the lock's), Python ${python.version}, Bazel ${bazel.version}"
              '';
            }
          );
          inherit wheel cpuTests;
        };

      forAll = f: builtins.listToAttrs (map (system: { name = system; value = f (perSystem system); }) systems);
    in
    {
      devShells = forAll (s: {
        default = s.devShell;
      });
      packages = forAll (s: {
        default = s.wheel;
        wheel = s.wheel;
      });
      checks = forAll (s: {
        cpu-tests = s.cpuTests;
      });
    };
}
