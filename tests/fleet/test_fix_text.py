"""A finding's fix on the node page: a command is shown as code with a Copy button;
advice in words is shown as text, without either. Which is which is the domain's call
(gpu.findings.fix_is_command)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from gpufleet import gpu
from gpufleet.fleet.models import Finding
from gpufleet.gpu import diagnosis, findings
from tests.factories import ingest


class _Fixes(HTMLParser):
    """The texts of code.fix-cmd and .fix-advice elements, and the copy buttons' targets."""

    def __init__(self):
        super().__init__()
        self.commands: dict[str, str] = {}
        self.advice: list[str] = []
        self.copies: list[str] = []
        self._open: tuple[str, str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if "fix-cmd" in classes:
            self._open = ("command", attrs.get("id", ""))
            self.commands[attrs.get("id", "")] = ""
        elif "fix-advice" in classes:
            self._open = ("advice", "")
            self.advice.append("")
        if tag == "button" and "copy" in classes:
            self.copies.append(attrs.get("data-copy", ""))

    def handle_endtag(self, tag):
        if tag in ("code", "p"):
            self._open = None

    def handle_data(self, data):
        if self._open and self._open[0] == "command":
            self.commands[self._open[1]] += data
        elif self._open:
            self.advice[-1] += data


def test_commands_are_told_from_advice():
    for command in (gpu.INSTALL_COMMAND, gpu.CDI_GENERATE_COMMAND, gpu.PERSISTENCE_COMMAND):
        assert findings.fix_is_command(command)
    for advice in (gpu.CDI_ENABLE_HINT, gpu.DRIVER_HINT, diagnosis.KERNEL_LOG_HINT, "", "Reboot the node."):
        assert not findings.fix_is_command(advice)
    assert gpu.Finding("toolkit", "t", "warn", "m", gpu.INSTALL_COMMAND).fix_is_command
    assert not gpu.Finding("cdi", "c", "warn", "m", gpu.CDI_ENABLE_HINT).fix_is_command


@pytest.mark.django_db
def test_the_node_page_copies_commands_and_shows_advice_as_text(viewer_client):
    node = ingest("alpha", 2, toolkit=None)  # the toolkit finding's fix is the install command
    Finding.objects.create(node=node, position=99, code="kernel-log", name="Kernel log (Xid errors)", status="warn",
                           message="Cannot read the kernel log", fix=diagnosis.KERNEL_LOG_HINT)
    page = viewer_client.get("/nodes/alpha/").content.decode()

    fixes = _Fixes()
    fixes.feed(page)
    assert fixes.commands.get("fix-toolkit") == gpu.INSTALL_COMMAND
    assert "fix-toolkit" in fixes.copies
    assert fixes.advice == [diagnosis.KERNEL_LOG_HINT]
    assert "fix-kernel-log" not in fixes.commands and "fix-kernel-log" not in fixes.copies
    assert set(fixes.copies) == set(fixes.commands)  # a Copy button only for a command
