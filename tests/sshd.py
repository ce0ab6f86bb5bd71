"""A private SSH "site" on this machine for the remote end-to-end tests (tests/test_e2e_remote.py):
two OpenSSH servers on 127.0.0.1, a jump host and a login host, that let only the unprivileged
test account in, by key, so that hpcsuite's remote commands can be run "from a laptop" (root,
with its own key and ssh_config) to a "login node" (this machine, as the account) the way a
user at a site runs them. Debian's sshd is started directly (no systemd, no system sshd_config,
nothing in /etc touched) and stopped with every session it started.

    with make_site(base, "hpcuser") as site:
        site.ssh("hpc-login", "id -un")        # through hpc-jump, as ssh -F site.config would

``base`` must be a directory the account can traverse (not pytest's tmp_path: /tmp/pytest-of-root
is mode 700), e.g. ``tempfile.mkdtemp(prefix="hpcsuite-sshd-")``. Root only.

``python tests/sshd.py`` checks this machine can run such a site."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"      # sshd re-executes itself for each connection: an absolute path
PRIVSEP_DIR = Path("/run/sshd")   # sshd's privilege-separation chroot; systemd makes it at boot
# Every session sshd starts carries this variable (sshd_config SetEnv), so stop() finds what a
# session left running after its sshd went away (a nohup'd process, a ControlMaster's shell).
MARKER = "HPCSUITE_TEST_SSHD_SITE"
HOSTS = ("jump", "login")


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    found, todo = [], list(tree.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, []))
    return found


def _marked(value: str) -> list[int]:
    """Processes whose environment has MARKER=value: the sessions of one site."""
    needle = f"{MARKER}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


class Site:
    """A jump host and a login host (two sshd on 127.0.0.1) and the client side to reach them:
    ``config`` (an ssh_config naming hpc-jump, hpc-login, hpc-direct, hpc-badkey, hpc-nowhere),
    ``key`` (authorized), ``other_key`` (not), ``known_hosts`` (both host keys)."""

    def __init__(self, base: Path, user: str):
        self.base = Path(base).resolve()
        self.user = user
        self.client = self.base / "client"
        self.config = self.client / "ssh_config"
        self.key = self.client / "id_ed25519"
        self.other_key = self.client / "other_ed25519"
        self.known_hosts = self.client / "known_hosts"
        self.jump_port = 0
        self.login_port = 0
        self.nowhere_port = 0
        self.logs = {name: self.base / name / "sshd.log" for name in HOSTS}
        self.processes: dict[str, subprocess.Popen] = {}
        self.authorized_dir: Path | None = None   # /run/hpcsuite-sshd-keys-*/<user>

    def __enter__(self) -> "Site":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ start
    def _start(self) -> None:
        """Keys, the two servers and the client's files (make_site)."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)
        # The laptop user's keys: root's, in a directory only root reads (ssh insists).
        self.client.mkdir(mode=0o700, exist_ok=True)
        self.client.chmod(0o700)
        _keygen(self.key, "laptop")
        _keygen(self.other_key, "stranger")
        # sshd's StrictModes checks every directory from the keys file up to / is root's (or
        # the account's) and writable by no one else, so the keys live under /run (root's, 755),
        # not under base, which sits in world-writable /tmp.
        self.authorized_dir = Path(tempfile.mkdtemp(prefix="hpcsuite-sshd-keys-", dir="/run"))
        self.authorized_dir.chmod(0o755)
        authorized = self.authorized_dir / self.user
        authorized.write_text(self.key.with_suffix(".pub").read_text())
        authorized.chmod(0o644)
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)

        ports = {"jump": free_port(), "login": free_port()}
        host_keys = []
        for name in HOSTS:
            host_keys.append((ports[name], self._start_sshd(name, ports[name])))
        self.jump_port, self.login_port = ports["jump"], ports["login"]
        self.nowhere_port = free_port()
        while self.nowhere_port in ports.values():
            self.nowhere_port = free_port()
        for name in HOSTS:
            self._wait_listening(name, ports[name])

        self.known_hosts.write_text("".join(
            f"[127.0.0.1]:{port} {' '.join(pub.split()[:2])}\n" for port, pub in host_keys))
        # IdentityFile accumulates across matching Host blocks, so each host names its own
        # (in Host * it would add the good key to hpc-badkey's). ssh passes -F to the child
        # ssh it runs for ProxyJump (OpenSSH >= 7.5), so hpc-jump resolves from this file too.
        common = f"    User {self.user}\n    IdentitiesOnly yes\n"
        self.config.write_text(
            f"Host hpc-jump\n    HostName 127.0.0.1\n    Port {self.jump_port}\n{common}"
            f"    IdentityFile {self.key}\n\n"
            f"Host hpc-login\n    HostName 127.0.0.1\n    Port {self.login_port}\n{common}"
            f"    IdentityFile {self.key}\n    ProxyJump hpc-jump\n\n"
            f"Host hpc-direct\n    HostName 127.0.0.1\n    Port {self.login_port}\n{common}"
            f"    IdentityFile {self.key}\n\n"
            f"Host hpc-badkey\n    HostName 127.0.0.1\n    Port {self.login_port}\n{common}"
            f"    IdentityFile {self.other_key}\n\n"
            f"Host hpc-nowhere\n    HostName 127.0.0.1\n    Port {self.nowhere_port}\n{common}"
            f"    IdentityFile {self.key}\n\n"
            f"Host *\n    UserKnownHostsFile {self.known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            f"    StrictHostKeyChecking yes\n    BatchMode yes\n    ConnectTimeout 5\n"
            f"    LogLevel ERROR\n")

    def _start_sshd(self, name: str, port: int) -> str:
        """sshd for host ``name`` on ``port``, in the foreground of its own process; its host
        public key."""
        home = self.base / name
        home.mkdir(mode=0o755, exist_ok=True)
        host_key = home / "ssh_host_ed25519_key"
        _keygen(host_key, f"hpc-{name}")
        config = home / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\n"
            f"PidFile {home / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_dir}/%u\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            # Without PAM sshd itself refuses an account whose password is locked ("User ...
            # not allowed because account is locked"): useradd leaves "!", as the test
            # account has. PAM's account check lets a key login through.
            "UsePAM yes\n"
            f"AllowUsers {self.user}\nPermitRootLogin no\nStrictModes yes\n"
            f"AllowTcpForwarding {'yes' if name == 'jump' else 'no'}\n"
            "X11Forwarding no\nPrintMotd no\nPrintLastLog no\n"
            "Subsystem sftp internal-sftp\n"
            f"SetEnv {MARKER}={self.base}\n"
            "LogLevel VERBOSE\n")
        check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"sshd rejects {config}: {check.stderr.strip()}")
        log = self.logs[name]
        with open(log, "ab") as err:   # what sshd says before it opens -E's log
            self.processes[name] = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config), "-E", str(log)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
        return host_key.with_suffix(".pub").read_text()

    def _wait_listening(self, name: str, port: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        process = self.processes[name]
        while not listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                state = (f"exited {process.returncode}" if process.poll() is not None
                         else f"not listening after {timeout:.0f} s")
                raise RuntimeError(f"sshd for hpc-{name} on port {port} {state}; "
                                   f"{self.logs[name]}:\n{_tail(self.logs[name])}")
            time.sleep(0.05)

    # ------------------------------------------------------------ use
    def ssh(self, host: str, *command: str, timeout: float = 60,
            **kw) -> subprocess.CompletedProcess:
        """``ssh -F config HOST COMMAND...`` (text, output captured unless ``kw`` says
        otherwise; ``options=[...]`` go before the host)."""
        options = list(kw.pop("options", []))
        kw.setdefault("capture_output", not ("stdout" in kw or "stderr" in kw))
        kw.setdefault("text", True)
        return subprocess.run(["ssh", "-F", str(self.config), *options, host, *command],
                              timeout=timeout, **kw)

    def pids(self) -> list[int]:
        """Every process of this site still alive: both sshd, their per-connection children
        and whatever a session started (even after its parent went away)."""
        tree = _children()
        found = set(_marked(str(self.base)))
        for process in self.processes.values():
            if process.poll() is None:
                found.add(process.pid)
                found.update(_descendants(process.pid, tree))
        for pid in list(found):
            found.update(_descendants(pid, tree))
        return sorted(found)

    # ------------------------------------------------------------ stop
    def stop(self) -> None:
        """Both sshd and every session they started gone, base and the keys directory
        removed. Per-connection sshd call setsid(), so a process group kill would miss them:
        the process tree and the sessions' marker find them."""
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                for process in self.processes.values():
                    process.poll()
                if not [pid for pid in pids if _alive(pid)]:
                    break
                time.sleep(0.05)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        shutil.rmtree(self.base, ignore_errors=True)
        if self.authorized_dir:
            shutil.rmtree(self.authorized_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def make_site(base: Path, user: str) -> Site:
    """A running Site in ``base`` (made, mode 755) for ``user``; stop() it (or use it as a
    context manager). Root only: sshd must switch to the account."""
    if os.geteuid() != 0:
        raise RuntimeError("a test SSH site needs root (sshd switches to the account)")
    site = Site(base, user)
    try:
        site._start()
    except BaseException:
        site.stop()
        raise
    return site


@contextlib.contextmanager
def small_disk(path: Path, size: str = "1m", uid: int | None = None):
    """A tmpfs of ``size`` mounted at ``path`` (made if missing): a disk that fills after
    ``size`` bytes, for "the remote disk is full". Mode 777, or owned by ``uid`` (mode 755).
    Root only; unmounted (lazily if something still uses it) on exit."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
                   check=True, capture_output=True, text=True)
    try:
        if uid is not None:
            os.chown(path, uid, -1)
            path.chmod(0o755)
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def main() -> int:
    user = sys.argv[1] if len(sys.argv) > 1 else "hpcuser"
    base = Path(tempfile.mkdtemp(prefix="hpcsuite-sshd-"))
    base.chmod(0o755)
    with make_site(base, user) as site:
        print(f"jump 127.0.0.1:{site.jump_port}, login 127.0.0.1:{site.login_port}, "
              f"config {site.config}")
        login = site.ssh("hpc-login", "id -un; echo $HOME")
        print("hpc-login:", login.stdout.strip().replace("\n", " "), login.stderr.strip())
        assert login.returncode == 0 and login.stdout.split()[0] == user, login
        direct = site.ssh("hpc-direct", "true")
        assert direct.returncode == 0, direct
        bad = site.ssh("hpc-badkey", "true")
        print("hpc-badkey:", bad.stderr.strip())
        assert bad.returncode == 255 and "Permission denied" in bad.stderr, bad
        nowhere = site.ssh("hpc-nowhere", "true")
        print("hpc-nowhere:", nowhere.stderr.strip())
        assert nowhere.returncode == 255 and "Connection refused" in nowhere.stderr, nowhere
        # A session left running must not outlive the site.
        site.ssh("hpc-login", "nohup sleep 300 >/dev/null 2>&1 & echo started")
        assert site.pids(), "no site processes while running"
    left = site.pids()
    assert not left, f"site processes left: {left}"
    assert not base.exists() and not site.authorized_dir.exists()
    print("ok: site stopped, nothing left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
