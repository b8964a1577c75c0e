"""list_cdi_spec_files and parse_spec_dirs."""

from __future__ import annotations

import os

from gpufleet.agent.adapters import list_cdi_spec_files, parse_spec_dirs

NV = "cdiVersion: 0.7.0\nkind: nvidia.com/gpu\ndevices: []\n"


def test_extensions_and_content_filter(tmp_path):
    d = tmp_path / "cdi"
    d.mkdir()
    for name in ("b.yaml", "a.yml", "c.json", "d.txt", "e.yaml.bak", "f.YAML"):
        (d / name).write_text(NV)
    (d / "other.yaml").write_text("cdiVersion: 0.7.0\nkind: vendor.com/fpga\n")
    (d / "dir.yaml").mkdir()
    assert list_cdi_spec_files([str(d)]) == [
        str(d / "a.yml"),
        str(d / "b.yaml"),
        str(d / "c.json"),
    ]


def test_recorded_spec_is_found(fake_host):
    path = fake_host.write_cdi_spec()
    assert list_cdi_spec_files(fake_host.spec_dirs) == [str(path)]
    assert path.parent == fake_host.run_cdi
    assert parse_spec_dirs(os.environ["GPUFLEET_CDI_SPEC_DIRS"]) == fake_host.spec_dirs


def test_dirs_in_order_entries_sorted(fake_host):
    z = fake_host.write_cdi_spec("z.yaml", where="etc")
    b = fake_host.write_cdi_spec(
        "b.json", where="run", content='{"kind": "nvidia.com/gpu"}'
    )
    a = fake_host.write_cdi_spec("a.yaml", where="run")
    assert list_cdi_spec_files(fake_host.spec_dirs) == [str(z), str(a), str(b)]


def test_same_file_through_a_symlinked_dir_counts_once(tmp_path):
    run = tmp_path / "run"
    (run / "cdi").mkdir(parents=True)
    (run / "cdi" / "nvidia.yaml").write_text(NV)
    var_run = tmp_path / "var-run"
    var_run.symlink_to(run)  # like /var/run -> /run
    dirs = [str(var_run / "cdi"), str(run / "cdi")]
    assert list_cdi_spec_files(dirs) == [str(var_run / "cdi" / "nvidia.yaml")]


def test_symlinked_file_and_repeated_dir_count_once(tmp_path):
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "nvidia.yaml").write_text(NV)
    (d / "z-link.yaml").symlink_to(d / "nvidia.yaml")
    (d / "dangling.yaml").symlink_to(tmp_path / "gone.yaml")
    assert list_cdi_spec_files([str(d), str(d)]) == [str(d / "nvidia.yaml")]


def test_missing_and_unreadable_dirs_are_skipped(tmp_path):
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "nvidia.json").write_text('{"kind":"nvidia.com/gpu"}')
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text(NV)
    dirs = [str(tmp_path / "missing"), str(not_a_dir), str(d)]
    assert list_cdi_spec_files(dirs) == [str(d / "nvidia.json")]
    assert list_cdi_spec_files([]) == []


def test_marker_far_beyond_the_read_limit_is_not_seen(tmp_path):
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "huge.yaml").write_bytes(
        b"#" * (2 * 1024 * 1024) + b"\nkind: nvidia.com/gpu\n"
    )
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00kind: nvidia.com/gpu\n")
    assert list_cdi_spec_files([str(d)]) == [str(d / "binary.yaml")]


def test_parse_spec_dirs():
    assert parse_spec_dirs(None) == ["/etc/cdi", "/var/run/cdi"]
    assert parse_spec_dirs("") == ["/etc/cdi", "/var/run/cdi"]
    assert parse_spec_dirs("::") == ["/etc/cdi", "/var/run/cdi"]
    assert parse_spec_dirs("/a::/b:") == ["/a", "/b"]
    assert parse_spec_dirs(" /a : /a:/c") == ["/a", "/c"]
