"""Boot the test VM (tests/vm.py) with the real systemd as PID 1, the shipped units
installed unchanged, and run one command as a oneshot service inside it.

    python -m tests.systemd_vm [--timeout SECONDS] -- COMMAND...

What it builds (see shared/notes/systemd-in-the-vm.md for why each step):

* on the host, once per source tree: a venv made with Debian's /usr/bin/python3 (a
  Python under /root would be hidden by the unit's ProtectHome=), forq installed into
  it non-editable with the test handlers (tests/tasks.py as `forq_test_tasks`), its
  script shebangs pointing at /opt/forq/venv, where the VM mounts it;
* in the VM, before systemd starts: a writable overlay root on a tmpfs over the
  read-only 9p host root, the checkout and that venv bind-mounted from the 9p root,
  udev/getty/timers masked, systemd-tmpfiles kept away from /tmp, the service user
  `forq`, the units of systemd/ copied unchanged to /etc/systemd/system, and a target
  whose oneshot service runs COMMAND in the checkout (as root, not hardened), then
  powers off. COMMAND's exit code comes back as this one's.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests import vm
from tests.test_wheel import _copy_source

ROOT = Path(__file__).resolve().parent.parent
VENV_IN_VM = "/opt/forq/venv"
DEBIAN_PYTHON = "/usr/bin/python3"
MASKED = (
    "systemd-remount-fs.service", "systemd-udevd.service", "systemd-udev-trigger.service",
    "systemd-udev-settle.service", "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket", "systemd-timesyncd.service", "systemd-pstore.service",
    "apt-daily.service", "apt-daily.timer", "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer", "e2scrub_all.timer", "fstrim.timer", "logrotate.timer",
    "man-db.timer", "getty.target", "console-getty.service", "serial-getty@ttyS0.service",
    "systemd-firstboot.service", "systemd-networkd-wait-online.service", "epmd.socket",
)

_INIT = """#!/bin/sh
# PID 1 until systemd: a writable root over the read-only host root, then systemd.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
S=/mnt
R=$S/root
mount -t tmpfs -o size=768m tmpfs $S
mkdir -p $S/upper $S/work $R
mount -t overlay overlay -o lowerdir=/,upperdir=$S/upper,workdir=$S/work $R
# from the 9p root, not through the overlay: tmpfiles' rules must not reach them
mount --bind {checkout} $R{checkout}
mkdir -p $R{venv}
mount --bind {venv_host} $R{venv}
mkdir -p $R/mnt/vm-out
mount -t 9p -o trans=virtio,version=9p2000.L vmout $R/mnt/vm-out
rm -f $R/.dockerenv
ln -sf /dev/null $R/etc/tmpfiles.d/tmp.conf
for unit in {masked}; do ln -sf /dev/null $R/etc/systemd/system/$unit; done
cp {checkout}/systemd/forq.service {checkout}/systemd/forq@.service $R/etc/systemd/system/
chroot $R useradd --system --home-dir /var/lib/forq --shell /usr/sbin/nologin forq
# Redis must be able to write its snapshot (the host's /var/lib/redis may be root's):
# a failed background save makes it refuse every write (stop-writes-on-bgsave-error)
chroot $R chown redis:redis /var/lib/redis 2>/dev/null || true
mkdir -p $R/etc/forq
cat > $R/etc/systemd/system/forq-vm-test.target <<'EOF'
[Unit]
Description=forq: the test in the VM
Requires=basic.target forq-vm-test.service
After=basic.target forq-vm-test.service
AllowIsolate=yes
EOF
cat > $R/etc/systemd/system/forq-vm-test.service <<'EOF'
[Unit]
Description=forq: the test command
After=basic.target systemd-journald.service
[Service]
Type=oneshot
WorkingDirectory={checkout}
Environment=PATH={path} HOME=/root LANG=C.UTF-8 TERM=dumb PYTHONDONTWRITEBYTECODE=1 FORQ_IN_SYSTEMD_VM=1
ExecStart=/usr/local/sbin/forq-vm-test
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
EOF
cat > $R/usr/local/sbin/forq-vm-test <<'EOF'
#!/bin/sh
{command}
echo $? > /mnt/vm-out/rc
sync
# off at once: an orderly shutdown would wait on units (Debian's redis-server.service
# has TimeoutStopSec=0) for nothing the test needs
echo o > /proc/sysrq-trigger
EOF
chmod 755 $R/usr/local/sbin/forq-vm-test
exec switch_root $R /lib/systemd/systemd
"""


def venv_for_vm() -> Path:
    """The venv the units run, built on the host (see the module docstring); reused
    while the sources it was built from are unchanged."""
    if not os.access(DEBIAN_PYTHON, os.X_OK):
        raise vm.VMUnavailable(f"{DEBIAN_PYTHON} missing (apt-get install python3 python3-venv)")
    source = Path(tempfile.mkdtemp(prefix="forq-vm-src-"))
    try:
        return _venv_from(_copy_source(source / "forq"))
    finally:
        shutil.rmtree(source, ignore_errors=True)


def _venv_from(tree: Path) -> Path:
    """The venv for a copy of the sources (what the wheel test builds from), keyed by
    their content and the test handlers'."""
    digest = hashlib.sha256()
    for f in sorted(p for p in tree.rglob("*") if p.is_file()) + [ROOT / "tests" / "tasks.py"]:
        digest.update(str(f.relative_to(tree) if f.is_relative_to(tree) else f.name).encode()
                      + b"\0" + f.read_bytes())
    venv = vm.CACHE / f"venv-{digest.hexdigest()[:16]}"
    if (venv / "ready").exists():
        return venv
    vm.CACHE.mkdir(exist_ok=True)
    for old in vm.CACHE.glob("venv-*"):  # another checkout's run may still use a recent one
        if time.time() - old.stat().st_mtime > 6 * 3600:
            shutil.rmtree(old, ignore_errors=True)
    build = Path(f"{venv}.partial")
    shutil.rmtree(build, ignore_errors=True)
    try:
        subprocess.run([DEBIAN_PYTHON, "-m", "venv", str(build)], check=True,
                       capture_output=True)
        # non-editable: the VM has the venv, not a path back into this checkout
        subprocess.run([str(build / "bin" / "pip"), "install", "--quiet",
                        "--disable-pip-version-check", str(tree)],
                       check=True, capture_output=True, cwd="/")
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(build, ignore_errors=True)
        raise RuntimeError(f"building the VM's venv failed: {exc.stderr.decode()[-2000:]}") from None
    site = next((build / "lib").glob("python3*/site-packages"))
    shutil.copy(ROOT / "tests" / "tasks.py", site / "forq_test_tasks.py")  # "your handlers"
    for script in (build / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            head = script.read_bytes()
            if head.startswith(b"#!") and str(build).encode() in head.split(b"\n", 1)[0]:
                script.write_bytes(b"#!" + f"{VENV_IN_VM}/bin/python".encode()
                                   + b"\n" + head.split(b"\n", 1)[1])
    (build / "ready").write_text("")
    build.rename(venv)
    return venv


def run(command: list[str], *, timeout: float = 600,
        out: Path | None = None) -> tuple[int, str]:
    """Run `command` (in this checkout, as root) as a oneshot service under systemd in
    the VM; (its exit code, or -1; the console output)."""
    venv = venv_for_vm()
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/sbin", "/usr/bin",
                            "/sbin", "/bin"])
    init = _INIT.format(checkout=shlex.quote(str(ROOT)), venv=VENV_IN_VM,
                        venv_host=shlex.quote(str(venv)), masked=" ".join(MASKED),
                        path=path, command=" ".join(shlex.quote(c) for c in command))
    # PID 1 logs to the journal (the tests read its lines about the units there, e.g. a
    # watchdog timeout); the test command's own output goes to the console
    cmdline = ("systemd.unified_cgroup_hierarchy=1 systemd.unit=forq-vm-test.target "
               "systemd.log_target=journal-or-kmsg systemd.log_level=info "
               "systemd.show_status=false")
    return vm.boot(init, timeout=timeout, memory_mib=2048, out=out, cmdline=cmdline)


def main(argv: list[str]) -> int:
    timeout = 600.0
    if argv[:1] == ["--timeout"]:
        timeout, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        rc, console = run(argv, timeout=timeout)
    except vm.VMUnavailable as exc:
        print(f"tests.systemd_vm: {exc}", file=sys.stderr)
        return 3
    sys.stdout.write(console)
    return rc if rc >= 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
