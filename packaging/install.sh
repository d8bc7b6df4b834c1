#!/bin/sh
# Install localinfer (editable) into a virtual environment, with llama.cpp built for this
# machine's GPU and with its RPC backend (`localinfer worker`, `serve --workers`).
# Usage: packaging/install.sh VENV [EXTRAS] [--gpu auto|cuda|rocm|vulkan|metal|sycl|cpu]
#                             [--dry-run]
#   e.g. packaging/install.sh .venv starter,test
#
# --gpu auto (the default) looks for a GPU and the toolkit that builds for it: nvidia-smi and
# nvcc (CUDA), rocminfo and hipcc (ROCm), sycl-ls and icpx (SYCL), vulkaninfo with glslc and
# the Vulkan headers (Vulkan; a CPU-type device such as Mesa's llvmpipe does not count), or an
# Apple chip (Metal). It says what it found and what it chose, and what to install when a GPU's
# toolkit is missing; with no usable GPU it builds for the CPU. --dry-run stops there.
#
# pip builds llama-cpp-python from source with CMAKE_ARGS, but reuses a wheel it cached from an
# earlier build without looking at CMAKE_ARGS. A GPU build therefore gets a wheel cache of its
# own (PIP_CACHE_DIR/localinfer-BACKEND), and when the installed build still lacks RPC or the
# chosen backend, the cached wheel is dropped and llama-cpp-python rebuilt once (5-10 minutes).
set -eu

usage() {
    echo "usage: packaging/install.sh VENV [EXTRAS] [--gpu auto|cuda|rocm|vulkan|metal|sycl|cpu]" \
         "[--dry-run]" >&2
    exit 2
}
say() { echo "install.sh: $*" >&2; }

venv= extras= gpu=auto dry_run=
while [ $# -gt 0 ]; do
    case $1 in
        --gpu) [ $# -ge 2 ] || usage; gpu=$2; shift 2 ;;
        --gpu=*) gpu=${1#--gpu=}; shift ;;
        --dry-run) dry_run=1; shift ;;
        -*) say "unknown option $1"; usage ;;
        *) if [ -z "$venv" ]; then venv=$1; elif [ -z "$extras" ]; then extras=$1; else usage; fi
           shift ;;
    esac
done
[ -n "$venv" ] || usage
case $gpu in
    auto|cuda|rocm|vulkan|metal|sycl|cpu) ;;
    *) say "--gpu $gpu: choose one of auto, cuda, rocm, vulkan, metal, sycl, cpu"; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
user_cmake_args=${CMAKE_ARGS:-}

# --- what this machine has -----------------------------------------------------------------
have() { command -v "$1" >/dev/null 2>&1; }
find_tool() {  # the first of these commands or paths that exists
    for t in "$@"; do
        case $t in
            /*) [ -x "$t" ] && { echo "$t"; return 0; } ;;
            *) have "$t" && { command -v "$t"; return 0; } ;;
        esac
    done
    return 1
}
nvidia_gpus() { have nvidia-smi && nvidia-smi -L 2>/dev/null | grep '^GPU ' | sed 's/ (UUID.*//'; }
amd_targets() {
    rocm=$(find_tool rocminfo "${ROCM_PATH:-/opt/rocm}/bin/rocminfo") || return 0
    "$rocm" 2>/dev/null | sed -n 's/^ *Name: *\(gfx[0-9a-f]*\) *$/\1/p' | sort -u | tr '\n' ' '
}
sycl_gpus() { have sycl-ls && sycl-ls 2>/dev/null | grep -i 'level_zero:gpu' || true; }
vulkan_gpus() {  # devices vulkaninfo lists that are not CPU-type (llvmpipe is a CPU)
    have vulkaninfo || return 0
    vulkaninfo --summary 2>/dev/null | awk '
        /deviceType/ { type = $3 }
        /deviceName/ { sub(/^[^=]*= */, ""); if (type != "PHYSICAL_DEVICE_TYPE_CPU") print }'
}
vulkan_include_dir() {  # where the build will look for vulkan/vulkan_core.h
    dir=$(printf '%s\n' "$user_cmake_args" | sed -n 's/.*-DVulkan_INCLUDE_DIR=\([^ ]*\).*/\1/p')
    echo "${dir:-/usr/include}"
}
vulkan_header_version() {
    h="$(vulkan_include_dir)/vulkan/vulkan_core.h"
    [ -f "$h" ] && sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$h" | head -n1
}
is_apple_silicon() { [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; }

# The distro's packages for each toolkit, named in the messages below.
hint_cuda="the CUDA toolkit (nvcc): Debian/Ubuntu: apt install nvidia-cuda-toolkit;"\
" Fedora/RHEL: dnf install cuda-toolkit (NVIDIA's repository); Arch: pacman -S cuda"
hint_rocm="ROCm with hipcc: Ubuntu/Debian: apt install rocm-hip-sdk (AMD's repository,"\
" or Debian 13's hipcc librocblas-dev libhipblas-dev); Fedora: dnf install rocm-hip-devel"\
" hipblas-devel rocblas-devel; Arch: pacman -S rocm-hip-sdk"
hint_vulkan="the Vulkan SDK pieces: Debian/Ubuntu: apt install glslc libvulkan-dev"\
" spirv-headers; Fedora: dnf install glslc vulkan-headers vulkan-loader-devel; Arch: pacman -S"\
" shaderc vulkan-headers vulkan-icd-loader"
hint_sycl="Intel oneAPI (icpx, sycl-ls; then: . /opt/intel/oneapi/setvars.sh):"\
" apt install intel-oneapi-base-toolkit (Intel's repository)"
hint_metal="Xcode's command line tools: xcode-select --install"

# Whether the toolkit for a backend is here; prints what is missing when not.
toolkit_missing() {
    case $1 in
        cuda) find_tool nvcc "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" >/dev/null || echo "$hint_cuda" ;;
        rocm) find_tool hipcc "${ROCM_PATH:-/opt/rocm}/bin/hipcc" >/dev/null || echo "$hint_rocm" ;;
        sycl) have icpx || echo "$hint_sycl" ;;
        metal) have xcrun || echo "$hint_metal" ;;
        vulkan)
            if ! have glslc; then echo "$hint_vulkan"; return; fi
            v=$(vulkan_header_version)
            if [ -z "$v" ]; then
                echo "$hint_vulkan (no vulkan/vulkan_core.h under $(vulkan_include_dir))"
            elif [ "$v" -lt 272 ]; then
                # llama.cpp's Vulkan backend uses vk::LayerSettingEXT (headers 1.3.272).
                echo "Vulkan headers 1.3.272 or newer: those under $(vulkan_include_dir) are" \
                     "1.3.$v (Debian 12 ships 1.3.239). Install newer ones (Debian 13,"\
                     "Ubuntu 24.04: apt install libvulkan-dev), or unpack a newer" \
                     "libvulkan-dev (dpkg-deb -x libvulkan-dev_*.deb DIR) and run with" \
                     "CMAKE_ARGS=\"-DVulkan_INCLUDE_DIR=DIR/usr/include\""
            fi ;;
    esac
}

choose_auto() {  # sets gpu; says what it found
    found=
    if is_apple_silicon; then say "found an Apple chip ($(uname -m))"; gpu=metal; return; fi
    gpus=$(nvidia_gpus || true)
    if [ -n "$gpus" ]; then
        say "found NVIDIA: $(echo "$gpus" | tr '\n' ';' | sed 's/;$//')"
        missing=$(toolkit_missing cuda)
        [ -z "$missing" ] && { gpu=cuda; return; }
        say "the CUDA build needs $missing"; found=1
    fi
    targets=$(amd_targets)
    if [ -n "$targets" ]; then
        say "found AMD GPU(s): $targets(rocminfo)"
        missing=$(toolkit_missing rocm)
        [ -z "$missing" ] && { gpu=rocm; return; }
        say "the ROCm build needs $missing"; found=1
    fi
    gpus=$(sycl_gpus)
    if [ -n "$gpus" ]; then
        say "found an Intel GPU (sycl-ls)"
        missing=$(toolkit_missing sycl)
        [ -z "$missing" ] && { gpu=sycl; return; }
        say "the SYCL build needs $missing"; found=1
    fi
    gpus=$(vulkan_gpus)
    if [ -n "$gpus" ]; then
        say "found Vulkan device(s): $(echo "$gpus" | tr '\n' ';' | sed 's/;$//')"
        missing=$(toolkit_missing vulkan)
        [ -z "$missing" ] && { gpu=vulkan; return; }
        say "the Vulkan build needs $missing"; found=1
    elif [ -z "$found" ] && [ -d /sys/class/drm ] && \
         grep -qs -e 0x10de -e 0x1002 -e 0x8086 /sys/class/drm/card[0-9]*/device/vendor; then
        say "a GPU is in /sys/class/drm but no GPU tool answered (nvidia-smi, rocminfo," \
            "vulkaninfo): to build for it, install its driver's tools and $hint_vulkan" \
            "(apt install vulkan-tools), then run this again"
        found=1
    fi
    if [ -n "$found" ]; then
        say "building for the CPU for now; install the toolkit named above and run this again"
    else
        say "no GPU found (looked for nvidia-smi, rocminfo, sycl-ls, vulkaninfo, an Apple chip)"
    fi
    gpu=cpu
}

if [ "$gpu" = auto ]; then
    choose_auto
else
    missing=$(toolkit_missing "$gpu")
    if [ -n "$missing" ]; then
        say "--gpu $gpu needs $missing"
        exit 1
    fi
fi

case $gpu in
    cuda) gpu_args="-DGGML_CUDA=on"; backend=CUDA ;;
    rocm) targets=$(amd_targets | sed 's/ *$//; s/ /;/g')
          gpu_args="-DGGML_HIP=on${targets:+ -DGPU_TARGETS=$targets}"; backend=ROCm
          if have hipconfig; then
              HIPCXX="$(hipconfig -l)/clang"; HIP_PATH="$(hipconfig -R)"; export HIPCXX HIP_PATH
          fi ;;
    vulkan) gpu_args="-DGGML_VULKAN=on"; backend=Vulkan ;;
    metal) gpu_args="-DGGML_METAL=on"; backend=Metal ;;
    sycl) gpu_args="-DGGML_SYCL=on -DCMAKE_C_COMPILER=icx -DCMAKE_CXX_COMPILER=icpx"
          backend=SYCL ;;
    *) gpu_args=""; backend=CPU ;;
esac
export CMAKE_ARGS="-DGGML_RPC=on${gpu_args:+ $gpu_args}${user_cmake_args:+ $user_cmake_args}"
say "building llama.cpp for: $backend (--gpu $gpu); CMAKE_ARGS=\"$CMAKE_ARGS\""
[ -z "$dry_run" ] || exit 0

# --- install -------------------------------------------------------------------------------
pip="$venv/bin/pip"
python="$venv/bin/python"
requirement=$(sed -n 's/^ *"\(llama-cpp-python[^"]*\)",*$/\1/p' "$root/pyproject.toml" | head -n1)
if [ "$gpu" != cpu ]; then
    # A wheel cache of this backend's own, so a CPU install never gets this wheel (nor this
    # one the CPU's).
    PIP_CACHE_DIR="$("$pip" cache dir)/localinfer-$gpu"
    export PIP_CACHE_DIR
    "$pip" install "$requirement"
fi
"$pip" install -e "$root${extras:+[$extras]}"

# The registries of the installed build ("CPU RPC Vulkan ..."), asked through ggml.
backends_py='
import ctypes, llama_cpp
from llama_cpp._ggml import libggml as g
llama_cpp.llama_backend_init()
g.ggml_backend_reg_count.restype = ctypes.c_size_t
g.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
g.ggml_backend_reg_get.restype = ctypes.c_void_p
g.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
g.ggml_backend_reg_name.restype = ctypes.c_char_p
print(" ".join(g.ggml_backend_reg_name(g.ggml_backend_reg_get(i)).decode()
               for i in range(g.ggml_backend_reg_count())))'
build_matches() {
    have_regs=" $("$python" -c "$backends_py" 2>/dev/null) "
    case $have_regs in *" RPC "*) ;; *) return 1 ;; esac
    case $gpu in
        cuda) case $have_regs in *" CUDA "*) ;; *) return 1 ;; esac ;;
        rocm) case $have_regs in *" ROCm "*|*" HIP "*|*" CUDA "*) ;; *) return 1 ;; esac ;;
        vulkan) case $have_regs in *" Vulkan "*) ;; *) return 1 ;; esac ;;
        metal) case $have_regs in *" Metal "*|*" MTL "*) ;; *) return 1 ;; esac ;;
        sycl) case $have_regs in *" SYCL "*) ;; *) return 1 ;; esac ;;
        cpu) case $have_regs in *" CUDA "*|*" ROCm "*|*" Vulkan "*|*" SYCL "*) return 1 ;; esac ;;
    esac
}
if ! build_matches; then
    version=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')
    say "llama-cpp-python $version came from a cached wheel built for other backends" \
        "($("$python" -c "$backends_py" 2>/dev/null || echo unknown)); rebuilding it for" \
        "$backend with RPC (5-10 minutes, once)"
    "$pip" cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
    "$pip" install --force-reinstall --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version"
    if ! build_matches; then
        say "the rebuilt llama-cpp-python still lacks $backend or RPC" \
            "($("$python" -c "$backends_py" 2>/dev/null || echo unknown)); see pip's output above"
        exit 1
    fi
fi
say "llama.cpp backends: $("$python" -c "$backends_py")"
