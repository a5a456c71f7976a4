"""A real SIP phone on this host: Debian's ``baresip``, dialling, pressing keys, hanging up, recording.

Why baresip and not SIPp: a caller must keep a two-way G.711 call going for as long as the test
says, answer the bridge's RTP with its own, send DTMF as RFC 4733 events, hang up with a BYE when
told, and keep what it heard. baresip is a user agent that does all of that as a phone does;
SIPp plays scripted messages and pcap files and records nothing it receives.

Set-up (``scripts/setup.sh dev`` installs ``baresip``): one call per :class:`Caller`, in a folder
of its own holding baresip's ``config`` and ``accounts`` (no registration: it dials the bridge's
URI directly), G.711 µ-law only (``PCMU``, 8 kHz, 20 ms packets), its microphone a silent WAV
(``aufile``), its loudspeaker ALSA's ``null`` device. baresip's ``sndfile`` filter writes what it
decodes from the bridge's RTP to ``dump-*-dec.wav``, and with no jitter buffer (``jitter_buffer_delay
0-0``) it decodes each packet as it arrives, so the file's length
in samples follows the arrival clock: :meth:`Caller.watch` samples it every few ms and
:meth:`Caller.arrival` turns a sample index into the moment it arrived. Keys go to baresip's
console (``stdio``) through a pseudo-terminal: a digit during a call is a DTMF digit, ``/hangup``
hangs up.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import pty
import shutil
import subprocess
import time
import wave
from pathlib import Path

import numpy as np

from myna.bench.processes import free_port, random_port_range, terminate

#: The phone band: what the caller's G.711 decodes to.
PHONE_RATE = 8000


def missing_baresip() -> str | None:
    """What to install when ``baresip`` is missing (None: it is there)."""
    return None if shutil.which("baresip") else "baresip is not installed: run `bash scripts/setup.sh dev` (apt-get install baresip)"


class Caller:
    """One phone call placed with ``baresip`` from ``folder``.

    Args:
        folder: a fresh folder for baresip's configuration, log and recordings.
        address: the local address to call from (the bridge must reach it).
        seconds: baresip quits after this long whatever happens (a bound, not a wait).
    """

    def __init__(self, folder: Path, address: str = "127.0.0.1", seconds: float = 120.0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.address = address
        self.seconds = seconds
        self.proc: subprocess.Popen | None = None
        self._keys: int | None = None  # the pseudo-terminal's side we type on
        self._growth: list[tuple[float, int]] = []  # (monotonic s, samples in the recording)
        self._watching: asyncio.Task | None = None
        self._seen: dict[str, float] = {}  # log line → when first seen (monotonic s)

    def _write_config(self) -> None:
        silence = self.folder / "microphone.wav"
        with wave.open(str(silence), "wb") as w:  # the caller says nothing (baresip stops at its end)
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(PHONE_RATE)
            w.writeframes(b"\0\0" * PHONE_RATE * int(self.seconds + 5))
        low, high = random_port_range(30000, 39000, 20)
        (self.folder / "config").write_text("\n".join([
            "poll_method epoll",
            f"sip_listen {self.address}:{free_port()}",
            "audio_player alsa,null",
            f"audio_source aufile,{silence}",
            "audio_alert alsa,null",
            "module_path /usr/lib/baresip/modules",
            "module stdio.so", "module g711.so", "module aufile.so", "module alsa.so", "module sndfile.so",
            "module_app account.so", "module_app menu.so",
            f"snd_path {self.folder}",
            f"rtp_ports {low}-{high}",
            "jitter_buffer_delay 0-0",  # no jitter buffer: a packet is decoded (and recorded) as it arrives
            "",
        ]))
        (self.folder / "accounts").write_text(f"<sip:caller@{self.address}>;regint=0;audio_codecs=PCMU\n")

    def dial(self, uri: str) -> None:
        """Start baresip and dial ``uri`` (returns at once; :meth:`established` waits for the answer).

        Raises:
            RuntimeError: baresip is not installed.
        """
        if (missing := missing_baresip()) is not None:
            raise RuntimeError(missing)
        self._write_config()
        self._keys, console = pty.openpty()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(["baresip", "-f", str(self.folder), "-e", f"/dial {uri}", "-t", str(int(self.seconds))],
                                         stdin=console, stdout=log, stderr=subprocess.STDOUT)
        os.close(console)

    @property
    def log_path(self) -> Path:
        return self.folder / "baresip.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def established(self, timeout: float = 20.0) -> float:
        """Wait until the call is answered; returns when baresip said so (monotonic s, ±5 ms).

        Raises:
            TimeoutError: not within ``timeout`` s, or baresip ended first (the message holds its log).
        """
        return await self._wait_for("Call established", timeout)

    async def terminated(self, timeout: float = 10.0) -> float:
        """Wait until the call has ended (either side hung up); returns when (monotonic s)."""
        return await self._wait_for("terminated", timeout)

    async def _wait_for(self, text: str, timeout: float) -> float:
        if text in self._seen:
            return self._seen[text]
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None and text not in self.log()):
                raise TimeoutError(f"baresip: no {text!r} within {timeout:g} s:\n{self.log()[-2000:]}")
            await asyncio.sleep(0.005)
        return self._seen.setdefault(text, time.monotonic())

    def press(self, digits: str) -> None:
        """Press keys during the call: each of ``0-9*#`` is sent as a DTMF digit (RFC 4733)."""
        os.write(self._keys, digits.encode())

    def hang_up(self) -> None:
        """Hang up (a SIP BYE)."""
        os.write(self._keys, b"/hangup\n")

    # -- what the caller heard ----------------------------------------------------------------
    @property
    def recording_path(self) -> Path | None:
        """baresip's recording of what it decoded from the bridge (None before the call's media)."""
        found = sorted(self.folder.glob("dump-*-dec.wav"))
        return found[-1] if found else None

    def watch(self, period: float = 0.002) -> None:
        """Start noting how many samples the recording holds, every ``period`` s (see :meth:`arrival`)."""
        async def sample() -> None:
            while True:
                path = self.recording_path
                if path is not None:
                    samples = max(0, (path.stat().st_size - 44) // 2)  # (a 44-byte WAV header, 16-bit mono)
                    if not self._growth or samples != self._growth[-1][1]:
                        self._growth.append((time.monotonic(), samples))
                await asyncio.sleep(period)

        self._watching = asyncio.get_running_loop().create_task(sample())

    def arrival(self, sample: int) -> float | None:
        """When (monotonic s) sample ``sample`` of the recording had arrived, as :meth:`watch` saw it
        (None: not yet)."""
        at = bisect.bisect_left([n for _, n in self._growth], sample + 1)
        return self._growth[at][0] if at < len(self._growth) else None

    def heard(self) -> np.ndarray:
        """What the caller heard so far: int16 mono at :data:`PHONE_RATE` ``[n]``."""
        path = self.recording_path
        if path is None:
            return np.zeros(0, np.int16)
        data = path.read_bytes()[44:]
        return np.frombuffer(data[: len(data) // 2 * 2], np.int16)

    async def close(self) -> None:
        """Stop watching and end baresip (a call still up is hung up first)."""
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.gather(self._watching, return_exceptions=True)
        if self.proc is not None and self.proc.poll() is None:
            try:
                if "terminated" not in self.log():
                    self.hang_up()
                    await self.terminated(timeout=3.0)
                os.write(self._keys, b"/quit\n")
                deadline = time.monotonic() + 3.0
                while self.proc.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
            except (OSError, TimeoutError):
                pass
            terminate(self.proc, 5)
        if self._keys is not None:
            os.close(self._keys)
            self._keys = None
