#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prepares, on a machine with nvcc and the project's Debian packages, what a bare
# GPU machine needs to run scripts/device-check.sh without building: the CLI and
# the GPU test binaries built for sm_$CUDA_ARCH, the compiled monitors, and the
# shared libraries they load that a CUDA image may lack (libbpf, libelf,
# jansson, libmicrohttpd, libcurl and theirs; never the C library or the
# driver). The CUDA runtime is linked statically, so the GPU machine needs only
# its driver. Output: device-bundle/ (ignored by git; under 64 MiB), e.g. for
# the device tool: run "bash scripts/device-check.sh" with carry ["device-bundle"].
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA_ARCH=${CUDA_ARCH:-90}
BUILD=${BUILD:-build-bundle}
OUTDIR=${1:-device-bundle}
export PATH=$PATH:/usr/local/cuda/bin
bash scripts/deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >/dev/null
grep -q "MS_HAVE_CUDA" "$BUILD/build.ninja" || { echo "device-bundle: nvcc was not found: no CUDA build" >&2; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target megascope test_cuda_engine test_cuda_ops test_cuda_backend monitors
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/bin" "$OUTDIR/lib" "$OUTDIR/monitors"
cp "$BUILD/megascope" "$BUILD/test_cuda_engine" "$BUILD/test_cuda_ops" "$BUILD/test_cuda_backend" "$OUTDIR/bin/"
cp "$BUILD"/monitors/*.bpf.o "$OUTDIR/monitors/"
# the libraries beyond the C runtime and the driver
for b in "$OUTDIR"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u | while read -r so; do
  case $(basename "$so") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libstdc++.so*|libgcc_s.so*|libcuda.so*) ;;
    *) cp -L "$so" "$OUTDIR/lib/" ;;
  esac
done
git rev-parse HEAD >"$OUTDIR/COMMIT"
echo "$CUDA_ARCH" >"$OUTDIR/ARCH"
du -sh "$OUTDIR"
