"""The registry `e2b-desktop` Python SDK, unmodified, against a real `sandcell serve` and the
installed `desktop` template (run through tests/e2b/run.sh: E2B_API_URL, E2B_API_KEY set).

The SDK starts the X server, the xfce4 session and the VNC stream itself with commands of the
template (Xvfb, startxfce4, x11vnc, noVNC); every call below is the SDK's own, and each
assertion reads back what the desktop really did: the screen's pixels, the pointer, a window
and the file an application saved after the SDK typed into it.
"""

import os
import struct
import time
import zlib

import httpx
import pytest
from e2b import CommandExitException
from e2b_desktop import Sandbox


def png_size_and_colours(png: bytes):
    """(width, height, distinct colours in a sample of rows) of an 8-bit RGB(A) PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", png[:16]
    pos, idat, head = 8, b"", None
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, colour_type = head[0], head[1], head[2], head[3]
    assert depth == 8 and colour_type in (2, 6), head
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = 1 + width * bpp
    colours, prev = set(), bytearray(width * bpp)
    for y in range(height):
        line = bytearray(raw[y * stride + 1 : (y + 1) * stride])
        f = raw[y * stride]
        for i in range(len(line)):  # undo the row filter (PNG spec, section 9)
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 16 == 0:
            colours.update(bytes(line[i : i + 3]) for i in range(0, len(line), bpp))
        prev = line
    return width, height, len(colours)


def wait_for(what, probe, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.5)
    pytest.fail(f"{what} did not happen within {timeout}s")


def metric(series):
    text = httpx.get(os.environ["E2B_API_URL"] + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"/metrics has no {series}")


TAKEN = 'sandcell_installed_template_snapshots_total{outcome="taken"}'
FAILED = 'sandcell_installed_template_snapshots_total{outcome="failed"}'
RESTORED = 'sandcell_template_creates_total{path="restored"}'


@pytest.fixture(scope="module")
def snapshots_before():
    """The daemon's template snapshots before this module's first desktop create."""
    return metric(TAKEN), metric(FAILED)


@pytest.fixture(scope="module")
def desktop(snapshots_before):
    sbx = Sandbox.create(timeout=600)
    yield sbx
    sbx.kill()


def test_the_screen_is_a_painted_desktop_of_the_asked_size(desktop):
    assert desktop.get_screen_size() == (1024, 768)
    # xfdesktop paints its background and icons after the session is up: the screen goes
    # from black to a desktop with many colours (panel, icons, text).
    def painted():
        w, h, colours = png_size_and_colours(bytes(desktop.screenshot()))
        assert (w, h) == (1024, 768)
        return colours > 50
    wait_for("the desktop's first paint", painted)


def test_the_pointer_goes_where_it_is_sent(desktop):
    desktop.move_mouse(321, 234)
    assert desktop.get_cursor_position() == (321, 234)
    desktop.move_mouse(10, 700)
    assert desktop.get_cursor_position() == (10, 700)


def test_an_application_opens_in_a_window_and_takes_typed_text(desktop):
    desktop.files.write("/home/user/note.txt", "")
    desktop.open("/home/user/note.txt")

    def windows():
        try:
            return desktop.get_application_windows("mousepad")
        except CommandExitException:  # xdotool finds none yet: exit 1
            return []
    window = wait_for("mousepad's window", windows)[0]
    assert "note.txt" in desktop.get_window_title(window)
    wait_for("mousepad focused", lambda: desktop.get_current_window_id() == window, 10)
    desktop.write("typed by the SDK")
    desktop.press(["ctrl", "s"])
    wait_for(
        "the saved file",
        lambda: desktop.files.read("/home/user/note.txt") == "typed by the SDK",
        15,
    )


def test_launch_starts_an_application_by_its_desktop_entry(desktop):
    desktop.launch("xfce4-terminal")

    def windows():
        try:
            return desktop.get_application_windows("xfce4-terminal")
        except CommandExitException:
            return []
    wait_for("the terminal's window", windows)


def test_the_vnc_stream_serves_novnc(desktop):
    desktop.stream.start()
    try:
        assert desktop.stream.get_url().endswith("/vnc.html?autoconnect=true&resize=scale")
        page = desktop.commands.run("curl -sf http://127.0.0.1:6080/vnc.html").stdout
        assert "noVNC" in page
        # The VNC server answers the RFB handshake on its port.
        hello = desktop.commands.run(
            "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1',5900)); "
            "print(s.recv(12).decode())\""
        ).stdout
        assert hello.startswith("RFB "), hello
    finally:
        desktop.stream.stop()


def test_later_creates_restore_a_started_desktop(desktop, snapshots_before):
    # The template's start command started Xvfb and xfce4 at the module's first create; the
    # daemon then took the template's memory snapshot, and later creates restore it: the
    # SDK's own start commands find the desktop running (the image's Xvfb and startxfce4
    # wrappers) and the create answers without starting it again.
    taken, failed = snapshots_before
    wait_for("the desktop template's snapshot", lambda: metric(TAKEN) + metric(FAILED) > taken + failed, 300)
    assert (metric(TAKEN), metric(FAILED)) == (taken + 1, failed)
    restored = metric(RESTORED)
    begun = time.monotonic()
    again = Sandbox.create(timeout=120)
    try:
        print(f"restored desktop create: {time.monotonic() - begun:.2f} s")
        assert metric(RESTORED) == restored + 1, "the create did not restore the snapshot"
        assert again.get_screen_size() == (1024, 768)

        def painted():
            w, h, colours = png_size_and_colours(bytes(again.screenshot()))
            assert (w, h) == (1024, 768)
            return colours > 50
        begun = time.monotonic()
        wait_for("the restored desktop painted", painted, 30)
        print(f"restored desktop painted after {time.monotonic() - begun:.2f} s more")
        again.launch("xfce4-terminal")

        def windows():
            try:
                return again.get_application_windows("xfce4-terminal")
            except CommandExitException:
                return []
        wait_for("the restored desktop's terminal window", windows)
    finally:
        again.kill()


def test_another_resolution_gets_a_display_of_its_own(desktop):
    # The snapshot's display is 1024x768: a create that asks for another size gets it (the
    # image's Xvfb wrapper stops the restored display and starts the one asked for).
    other = Sandbox.create(timeout=120, resolution=(800, 600))
    try:
        size = other.get_screen_size()
        # what the wrappers did, for a failure's message
        log = other.commands.run("cat /tmp/sandcell-desktop.log; ps -eo pid,etimes,args | grep -i xvfb").stdout
        assert size == (800, 600), log
        w, h, _ = png_size_and_colours(bytes(other.screenshot()))
        assert (w, h) == (800, 600)
    finally:
        other.kill()
