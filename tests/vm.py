"""Run a command inside a small virtual machine whose kernel runs cgroup v2.

    python -m tests.vm [--timeout SECONDS] [--out DIR] -- COMMAND...

The machines forq is developed and tested on are cgroup v1/hybrid hosts (the memory
controller is bound to v1), so per-job cgroups (supervisor/isolation/cgroups.py) cannot be
exercised there. This boots Debian's kernel (package linux-image-amd64) under
qemu-system-x86_64 with the host's root file system shared read-only over 9p, mounts a
fresh cgroup2 hierarchy and a tmpfs on /run (TMPDIR=/run/tmp), brings up loopback, and
runs COMMAND as root in the current directory — the same files, the same venv, a
different kernel. Its output comes back on the serial console; its exit code is this
one's. --out DIR: a host directory the command may write, as /run/vm-out.

The VM uses software emulation (TCG) unless FORQ_VM_ACCEL says otherwise (``kvm``):
nested KVM hangs at early boot on our machines. Boot takes about 10 s under TCG, and a
fork is 10-15 times slower than on the host.
"""

from __future__ import annotations

import compileall
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(tempfile.gettempdir()) / "forq-vm"
ROOT = Path(__file__).resolve().parent.parent
_INIT = """#!/bin/sh
# PID 1 of the test VM: prepare a writable, cgroup-v2 world, run the command, power off.
export PATH={path}:/usr/sbin:/sbin
# the host's files are read-only here; /run is the guest's own (a tmpfs), and the host's
# /tmp stays visible (the checkout may live there): TMPDIR points at a writable one
mount -t tmpfs tmpfs /run
mkdir -p /run/tmp /run/vm-out
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t 9p -o trans=virtio,version=9p2000.L vmout /run/vm-out
ip link set lo up 2>/dev/null || ifconfig lo up 2>/dev/null
echo 0 > /proc/sys/kernel/printk 2>/dev/null
cd {cwd}
env -i PATH="$PATH" HOME=/run/tmp TMPDIR=/run/tmp LANG=C.UTF-8 TERM=dumb \\
    PYTHONDONTWRITEBYTECODE=1 FORQ_IN_VM=1 {command} </dev/null >/dev/console 2>&1
echo $? > /run/vm-out/rc
sync
echo o > /proc/sysrq-trigger
sleep 60
"""


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_v2_problem() -> str:
    """Why this machine cannot give a supervisor a cgroup v2 of its own, with the memory
    controller, as systemd's Delegate=yes would ("" if it can: no VM needed)."""
    from forq.supervisor.isolation import cgroups

    try:
        cgroups.locate()
    except cgroups.CgroupsUnavailable as exc:
        return str(exc)
    if os.geteuid() != 0:
        return "not root"
    try:
        with open(f"{CGROUP_ROOT}/cgroup.controllers") as f:
            if "memory" not in f.read().split():
                return f"no memory controller in {CGROUP_ROOT}"
    except OSError as exc:
        return f"cannot read {CGROUP_ROOT}: {exc}"
    return ""


def delegated_cgroup(prefix: str) -> str:
    """A new cgroup under the root with the memory controller available in it: what
    systemd makes for a unit with Delegate=yes. The caller removes it."""
    import uuid

    with open(f"{CGROUP_ROOT}/cgroup.subtree_control") as f:
        enabled = f.read().split()
    if "memory" not in enabled:
        with open(f"{CGROUP_ROOT}/cgroup.subtree_control", "w") as f:
            f.write("+memory")
    path = f"{CGROUP_ROOT}/{prefix}-{uuid.uuid4().hex[:8]}"
    os.mkdir(path)
    return path


def remove_cgroup_tree(path: str, attempts: int = 50) -> None:
    """Kill every process under `path`, then remove its cgroups, deepest first."""
    import time

    from forq.supervisor.isolation import cgroups

    for _ in range(attempts):
        for sub, _dirs, _files in os.walk(path, topdown=False):
            cgroups.kill_all(sub)
            try:
                os.rmdir(sub)
            except OSError:
                pass
        if not os.path.exists(path):
            return
        time.sleep(0.1)  # killed processes take a moment to leave their cgroups


def compile_checkout() -> None:
    """Byte-compile the checkout's Python files on the host. The VM cannot write .pyc
    files (the host's files are read-only there, and PYTHONDONTWRITEBYTECODE may be set
    on the host too), so without them every interpreter it starts compiles forq and the
    tests from source under emulation: the cgroup VM took 157 s with them on a quiet
    host, against 260 s without (beside a few test files) and 397 s in a CI run."""
    for tree in (*ROOT.glob("build/__editable__*"), ROOT / "tests", ROOT / "examples",
                 ROOT / "chaos"):
        if tree.is_dir():
            compileall.compile_dir(str(tree), quiet=2)


class VMUnavailable(Exception):
    """What the VM needs is missing here; ``str()`` says what to install."""


def kernel() -> tuple[str, str]:
    """(vmlinuz path, version) of the newest installed kernel image."""
    images = sorted(glob.glob("/boot/vmlinuz-*"),
                    key=lambda p: [int(x) if x.isdigit() else x
                                   for x in re.split(r"[.-]", p.split("vmlinuz-", 1)[1])])
    readable = [p for p in images if os.access(p, os.R_OK)
                and os.path.isdir(f"/lib/modules/{p.split('vmlinuz-', 1)[1]}")]
    if not readable:
        raise VMUnavailable("no kernel image with its modules in /boot "
                            "(apt-get install linux-image-amd64)")
    return readable[-1], readable[-1].split("vmlinuz-", 1)[1]


def initramfs(version: str) -> Path:
    """Debian's initramfs with just the modules a 9p root needs (built once, cached)."""
    out = CACHE / f"initrd-{version}.img"
    if out.exists():
        return out
    if shutil.which("mkinitramfs") is None:
        raise VMUnavailable("mkinitramfs missing (apt-get install initramfs-tools)")
    conf = Path(tempfile.mkdtemp(prefix="forq-vm-conf-"))
    try:
        for sub in ("scripts", "conf.d", "hooks"):
            (conf / sub).mkdir()
        (conf / "initramfs.conf").write_text("MODULES=list\nBUSYBOX=auto\nCOMPRESS=gzip\n")
        (conf / "modules").write_text("virtio_pci\n9pnet_virtio\n9p\n")
        CACHE.mkdir(exist_ok=True)
        partial = out.with_suffix(".partial")
        subprocess.run(["mkinitramfs", "-d", str(conf), "-o", str(partial), version],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        partial.rename(out)
    finally:
        shutil.rmtree(conf, ignore_errors=True)
    return out


def run(command: list[str], *, timeout: float = 600, memory_mib: int = 1536,
        out: Path | None = None) -> tuple[int, str]:
    """Run `command` in the VM; (its exit code, or -1 if it never reported one; the
    console output). `out`: a host directory the command may write, as /run/vm-out
    (default: a temporary one, removed)."""
    init = _INIT.format(path=shlex.quote(os.environ.get("PATH", "/usr/bin:/bin")),
                        cwd=shlex.quote(os.getcwd()),
                        command=" ".join(shlex.quote(c) for c in command))
    return boot(init, timeout=timeout, memory_mib=memory_mib, out=out)


def boot(init_script: str, *, timeout: float = 600, memory_mib: int = 1536,
         out: Path | None = None, cmdline: str = "loglevel=1") -> tuple[int, str]:
    """Boot the VM with `init_script` (a shell script) as PID 1 and more kernel
    `cmdline`; it writes its exit code to `rc` in the `vmout` share, `out` on the host.
    Returns (that code, or -1; the console output)."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise VMUnavailable("qemu-system-x86_64 missing (apt-get install qemu-system-x86)")
    vmlinuz, version = kernel()
    initrd = initramfs(version)
    compile_checkout()
    work = Path(tempfile.mkdtemp(prefix="forq-vm-"))
    try:
        if out is None:
            out = work / "out"
        out.mkdir(parents=True, exist_ok=True)
        (out / "rc").unlink(missing_ok=True)
        init = work / "init.sh"
        init.write_text(init_script)
        init.chmod(0o755)
        accel = os.environ.get("FORQ_VM_ACCEL", "tcg")
        cpu = ["-accel", "kvm"] if accel == "kvm" else ["-accel", "tcg,thread=multi",
                                                          "-cpu", "max"]
        # nice: the VM tests run beside the rest of the suite (tests/background.py), on
        # the CPU it leaves idle, without slowing its timing
        argv = [
            "nice", "-n", "10", qemu, *cpu, "-m", str(memory_mib), "-smp", "2", "-nographic", "-no-reboot",
            "-kernel", vmlinuz, "-initrd", str(initrd),
            "-append", f"root=hostroot rootfstype=9p rootflags=trans=virtio,version=9p2000.L,cache=loose,"
                       f"msize=262144 ro console=ttyS0 init={init} panic=-1 quiet {cmdline}",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                       "multidevs=remap",
            "-virtfs", f"local,path={out},mount_tag=vmout,security_model=none,multidevs=remap",
        ]
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=timeout)
            console = proc.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as exc:
            console = (exc.stdout or b"").decode(errors="replace")
            console += f"\n[tests.vm: no result after {timeout:g}s; VM stopped]\n"
        rc_file = out / "rc"
        rc = int(rc_file.read_text()) if rc_file.exists() else -1
        # the firmware's banner and screen-clearing escapes, before the kernel's console
        console = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1bc", "", console)
        console = re.sub(r"(?s)\A.*?Booting from ROM\.*", "", console)
        return rc, console
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    timeout, out = 600.0, None
    while argv[:1] in (["--timeout"], ["--out"]):
        if argv[0] == "--timeout":
            timeout = float(argv[1])
        else:
            out = Path(argv[1]).resolve()
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        rc, console = run(argv, timeout=timeout, out=out)
    except VMUnavailable as exc:
        print(f"tests.vm: {exc}", file=sys.stderr)
        return 3
    sys.stdout.write(console)
    return rc if rc >= 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
