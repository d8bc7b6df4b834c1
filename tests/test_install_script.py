"""packaging/install.sh --gpu: what it detects and what it builds, run with --dry-run on a PATH
of stand-in GPU tools (nvidia-smi, nvcc, rocminfo, hipcc, vulkaninfo, glslc, uname) that print
what the real ones print on such a machine, and the real shell utilities beside them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "packaging" / "install.sh"
UTILITIES = ("sh", "sed", "grep", "awk", "tr", "sort", "head", "dirname", "cat", "uname")

NVIDIA_SMI = "GPU 0: NVIDIA GeForce RTX 4070 (UUID: GPU-5d1c3b7e-0000-0000-0000-000000000000)"
ROCMINFO = """*******
Agent 2
*******
  Name:                    gfx1100
  Uuid:                    GPU-XX
  Marketing Name:          Radeon RX 7900 XTX
"""
VULKAN_LLVMPIPE = """Devices:
========
GPU0:
\tapiVersion         = 1.3.230
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""
VULKAN_ARC = """Devices:
========
GPU0:
\tapiVersion         = 1.3.274
\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName         = Intel(R) Arc(tm) A770 Graphics (DG2)
GPU1:
\tapiVersion         = 1.3.230
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""


def _run(tmp_path: Path, tools: dict[str, str], *args: str, cmake_args: str = ""
         ) -> subprocess.CompletedProcess[str]:
    """install.sh with only ``tools`` (name -> what it prints) and the shell utilities."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in UTILITIES:
        if name not in tools:
            (bin_dir / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    for name, output in tools.items():
        tool = bin_dir / name
        # A script as it is, or one that prints the text.
        tool.write_text(output if output.startswith("#!") else
                        f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
        tool.chmod(0o755)
    # No toolkit under its usual folder either (/usr/local/cuda, /opt/rocm).
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "CUDA_PATH": str(tmp_path / "none"),
           "ROCM_PATH": str(tmp_path / "none")}
    if cmake_args:
        env["CMAKE_ARGS"] = cmake_args
    return subprocess.run(["sh", str(SCRIPT), str(tmp_path / "venv"), *args, "--dry-run"],
                          env=env, capture_output=True, text=True, timeout=60,
                          executable=shutil.which("sh"))


def _headers(tmp_path: Path, version: int) -> str:
    include = tmp_path / "vk" / "include"
    (include / "vulkan").mkdir(parents=True)
    (include / "vulkan" / "vulkan_core.h").write_text(
        f"#define VK_HEADER_VERSION {version}\n")
    return f"-DVulkan_INCLUDE_DIR={include}"


def _chosen(result: subprocess.CompletedProcess[str]) -> str:
    line = next(x for x in result.stderr.splitlines() if "building llama.cpp for:" in x)
    return line.split("CMAKE_ARGS=", 1)[1].strip('"')


def test_no_gpu_builds_for_the_cpu_and_says_so(tmp_path):
    result = _run(tmp_path, {"vulkaninfo": VULKAN_LLVMPIPE})  # llvmpipe is not a GPU
    assert result.returncode == 0, result.stderr
    assert _chosen(result) == "-DGGML_RPC=on"
    assert "building llama.cpp for: CPU" in result.stderr
    if not any(Path("/sys/class/drm").glob("card[0-9]*/device/vendor")):
        assert "no GPU found" in result.stderr


def test_an_nvidia_gpu_with_nvcc_builds_cuda(tmp_path):
    result = _run(tmp_path, {"nvidia-smi": NVIDIA_SMI, "nvcc": "Cuda compilation tools"})
    assert result.returncode == 0, result.stderr
    assert "found NVIDIA: GPU 0: NVIDIA GeForce RTX 4070" in result.stderr
    assert _chosen(result) == "-DGGML_RPC=on -DGGML_CUDA=on"


def test_an_nvidia_gpu_without_nvcc_names_the_packages_and_builds_for_the_cpu(tmp_path):
    result = _run(tmp_path, {"nvidia-smi": NVIDIA_SMI})
    assert result.returncode == 0, result.stderr
    assert "apt install nvidia-cuda-toolkit" in result.stderr
    assert "install the toolkit named above and run this again" in result.stderr
    assert _chosen(result) == "-DGGML_RPC=on"


def test_an_amd_gpu_with_hipcc_builds_rocm_for_its_target(tmp_path):
    result = _run(tmp_path, {"rocminfo": ROCMINFO, "hipcc": "HIP version: 6.2"})
    assert result.returncode == 0, result.stderr
    assert "found AMD GPU(s): gfx1100" in result.stderr
    assert _chosen(result) == "-DGGML_RPC=on -DGGML_HIP=on -DGPU_TARGETS=gfx1100"


def test_a_vulkan_gpu_with_glslc_and_new_headers_builds_vulkan(tmp_path):
    result = _run(tmp_path, {"vulkaninfo": VULKAN_ARC, "glslc": "shaderc"},
                  cmake_args=_headers(tmp_path, 309))
    assert result.returncode == 0, result.stderr
    assert "found Vulkan device(s): Intel(R) Arc(tm) A770 Graphics (DG2)" in result.stderr
    assert "llvmpipe" not in result.stderr
    assert _chosen(result).startswith("-DGGML_RPC=on -DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=")


def test_vulkan_headers_too_old_are_named_with_the_way_out(tmp_path):
    result = _run(tmp_path, {"vulkaninfo": VULKAN_ARC, "glslc": "shaderc"},
                  cmake_args=_headers(tmp_path, 239))
    assert result.returncode == 0, result.stderr
    assert "1.3.239" in result.stderr and "-DVulkan_INCLUDE_DIR=DIR/usr/include" in result.stderr
    assert _chosen(result).startswith("-DGGML_RPC=on -DVulkan_INCLUDE_DIR=")  # the CPU build


def test_apple_silicon_builds_metal(tmp_path):
    uname = "#!/bin/sh\ncase $1 in -s) echo Darwin ;; -m) echo arm64 ;; esac"
    result = _run(tmp_path, {"uname": uname})
    assert result.returncode == 0, result.stderr
    assert _chosen(result) == "-DGGML_RPC=on -DGGML_METAL=on"


def test_an_explicit_backend_without_its_toolkit_fails_naming_the_packages(tmp_path):
    result = _run(tmp_path, {}, "--gpu", "vulkan")
    assert result.returncode == 1
    assert "--gpu vulkan needs" in result.stderr
    assert "apt install glslc libvulkan-dev spirv-headers" in result.stderr


@pytest.mark.parametrize("args", [["--gpu", "opencl"], ["--gpu"], ["--colour"]])
def test_bad_arguments_are_refused(tmp_path, args):
    result = _run(tmp_path, {}, *args)
    assert result.returncode == 2
    assert "usage: packaging/install.sh" in result.stderr or "choose one of" in result.stderr


def test_the_script_is_posix_sh():
    assert subprocess.run(["sh", "-n", str(SCRIPT)], check=False).returncode == 0
    assert os.access(SCRIPT, os.X_OK)
