"""The fake_host fixture itself: what it puts on PATH and in the environment."""

from __future__ import annotations

import os
import shutil

from gpufleet.agent.adapters import EngineDocker, SubprocessRunner


def test_defaults(fake_host):
    assert os.environ["DOCKER_HOST"] == fake_host.docker_url
    assert os.environ["GPUFLEET_CDI_SPEC_DIRS"] == ":".join(fake_host.spec_dirs)
    assert shutil.which("nvidia-smi") == str(fake_host.bin_dir / "nvidia-smi")
    assert shutil.which("nvidia-ctk") == str(fake_host.bin_dir / "nvidia-ctk")
    assert SubprocessRunner().run(["nvidia-smi"]).stdout.count("NVIDIA H200") == 8
    assert (
        SubprocessRunner()
        .run(["nvidia-ctk", "--version"])
        .stdout.startswith("NVIDIA Container Toolkit CLI version 1.18.2\n")
    )
    info = EngineDocker().info()
    assert "nvidia" in info.runtimes and len(info.cdi_devices) == 3


def test_absent_tools_are_not_found_anywhere(fake_host):
    fake_host.smi_missing()
    fake_host.ctk_missing()
    assert shutil.which("nvidia-smi") is None
    assert shutil.which("nvidia-ctk") is None


def test_docker_switches(fake_host):
    fake_host.docker("nvidia-runtime")
    info = EngineDocker().info()
    assert "nvidia" in info.runtimes and info.cdi_devices == ()
    fake_host.docker_error(500)
    assert "HTTP 500" in EngineDocker().info().error
    fake_host.docker_garbage()
    assert EngineDocker().info().error
    url = fake_host.docker_unreachable()
    assert EngineDocker().info().error.startswith(f"Docker at {url} is unreachable")
    fake_host.docker({"Runtimes": {"Nvidia": {}}})
    assert EngineDocker().info().runtimes == ("Nvidia",)
    # four calls got an answer; the unreachable one never arrived
    assert fake_host.engine.info_requests == 4


def test_smi_outputs_switch_and_exit_codes(fake_host):
    runner = SubprocessRunner()
    fake_host.smi("mixed")
    assert "RTX 3090" in runner.run(["nvidia-smi"]).stdout
    fake_host.smi("util-na")
    assert ", [N/A], " in runner.run(["nvidia-smi"]).stdout
    fake_host.smi("empty")
    result = runner.run(["nvidia-smi"])
    assert result.ok and result.stdout == ""
    fake_host.smi_text("x\n", "warn\n", exit_code=3)
    result = runner.run(["nvidia-smi"])
    assert (result.stdout, result.stderr, result.exit_code) == ("x\n", "warn\n", 3)
    fake_host.ctk_text(stderr="boom\n", exit_code=1)
    result = runner.run(["nvidia-ctk", "--version"])
    assert (result.stdout, result.stderr, result.exit_code) == ("", "boom\n", 1)
