"""Which of this node's GPUs NVLink joins, read from `nvidia-smi topo -m` (no torch).

A profile whose node bridges its PCIe cards in pairs (`nvlink.bridge_gbytes_per_s`: h100-pcie-80gb, a100-pcie-80gb)
prices a group of exactly two consecutive ranks at the bridge's rate (cost_models.comm.one_pair): local ranks 2i and
2i + 1, which parplan's runtime puts on CUDA devices 2i and 2i + 1 (`torch.cuda.set_device(LOCAL_RANK)`).  Whether
those two cards are the bridged ones is the machine's: bridges are fitted by hand, and CUDA_VISIBLE_DEVICES reorders
the devices.  `launch` reads the matrix before a run of such a plan and warns where a pair the plan relies on is not
NVLinked (with a device order that makes every pair a bridged one, where the node has one); `calibrate` on two GPUs
of a bridged base writes what it measured as the bridge's rate only where those two are NVLinked.

The matrix's rows are nvidia-smi's GPU indices, which are PCI bus order; CUDA's default device order is fastest first,
the same for a node of one GPU model, and CUDA_DEVICE_ORDER=PCI_BUS_ID makes it so for any (the fix launch prints
sets it).  A CUDA_VISIBLE_DEVICES of UUIDs or MIG instances is not mapped: the check says it cannot tell.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the header on a terminal
_GPU = re.compile(r"GPU(\d+)$")
_NVLINK = re.compile(r"NV\d+$")  # "NV#: a bonded set of # NVLinks" (the matrix's legend)
TOPO_TIMEOUT_S = 15


@dataclass(frozen=True)
class Topology:
    gpus: tuple[int, ...]  # nvidia-smi's GPU indices, in the matrix's order
    links: dict[tuple[int, int], str]  # (i, j), i < j: the matrix's cell (NV12, PHB, SYS, ...)

    def nvlinked(self, a: int, b: int) -> bool:
        return bool(_NVLINK.match(self.links.get((min(a, b), max(a, b)), "")))

    def link(self, a: int, b: int) -> str:
        return self.links.get((min(a, b), max(a, b)), "?")


def parse_topo(text: str) -> Optional[Topology]:
    """The GPU-to-GPU cells of `nvidia-smi topo -m`'s matrix; None where the text has no GPU matrix.  The first line
    whose first column is GPU<n> is the header (its leading GPU<n> columns are the matrix's); each later GPU<n> line
    is a row, its cells in the header's order (" X " on the diagonal: a row without it there, as where two cells
    ran together in a copied output, is skipped, each of its pairs read from the other GPU's row); NIC columns and
    the affinity columns after them are not read."""
    cols: Optional[list[int]] = None
    links: dict[tuple[int, int], str] = {}
    rows: list[int] = []
    for raw in text.splitlines():
        cells = _ANSI.sub("", raw).split()
        if not cells or not _GPU.match(cells[0]):
            continue
        if cols is None:
            cols = []
            for c in cells:
                m = _GPU.match(c)
                if not m:
                    break
                cols.append(int(m.group(1)))
            continue
        row = int(_GPU.match(cells[0]).group(1))
        if row not in cols or len(cells) < len(cols) + 1 or cells[1 + cols.index(row)] != "X":
            continue  # (a row whose own cell is not its X has cells run together or missing: read from the others)
        rows.append(row)
        for col, cell in zip(cols, cells[1:1 + len(cols)]):
            if col != row:
                links.setdefault((min(row, col), max(row, col)), cell)
    if not cols or not rows:
        return None
    return Topology(tuple(cols), links)


def _nvidia_smi(args: list[str], parse, what: str, timeout: float):
    """(parse(nvidia-smi ARGS' output), "") or (None, why): not on PATH, failed, or `what` not in its output."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi is not on PATH"
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"nvidia-smi {args[0]} failed ({type(e).__name__}: {e})"
    found = parse(out.stdout)
    if not found:
        said = (out.stderr or out.stdout).strip().splitlines()
        return None, f"nvidia-smi printed no {what}" + (f" ({said[0][:120]})" if said else "")
    return found, ""


def read_topology(timeout: float = TOPO_TIMEOUT_S) -> tuple[Optional[Topology], str]:
    """(`nvidia-smi topo -m`'s matrix, why not where None)."""
    return _nvidia_smi(["topo", "-m"], parse_topo, "GPU matrix (topo -m)", timeout)


def visible_gpus(topo: Topology, env: Optional[dict] = None) -> tuple[Optional[list[int]], str]:
    """The nvidia-smi indices of CUDA devices 0, 1, ... here (CUDA_VISIBLE_DEVICES's order; every GPU in the matrix
    where it is unset), or (None, why) where its entries are not indices."""
    env = os.environ if env is None else env
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(topo.gpus), ""
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        if not entry.isdigit():
            return None, f"CUDA_VISIBLE_DEVICES={spec} names devices other than by index"
        if int(entry) not in topo.gpus:  # CUDA stops at the first invalid entry
            break
        out.append(int(entry))
    return out, ""


def unbridged_pairs(topo: Topology, devices: list[int]) -> list[tuple[int, int]]:
    """The pairs (devices[2i], devices[2i + 1]) that NVLink does not join: the GPUs of local ranks 2i and 2i + 1."""
    return [(devices[i], devices[i + 1]) for i in range(0, len(devices) - 1, 2)
            if not topo.nvlinked(devices[i], devices[i + 1])]


def bridged_order(topo: Topology, gpus: list[int], n: int) -> Optional[list[int]]:
    """`n` of `gpus` in an order whose consecutive pairs (0, 1), (2, 3), ... are all NVLinked, the first such in
    the GPUs' own order (a pairing search: a node has at most a few dozen GPUs); None where none is."""
    need = n // 2

    def pick(free: list[int], pairs: list[tuple[int, int]]) -> Optional[list[tuple[int, int]]]:
        if len(pairs) == need:
            return pairs
        for i, a in enumerate(free):
            if len(free) - i < 2 * (need - len(pairs)):
                return None
            for b in free[i + 1:]:
                if topo.nvlinked(a, b):
                    found = pick([g for g in free[i + 1:] if g != b], pairs + [(a, b)])
                    if found:
                        return found
            # `a` unpaired: the pairs still needed come from the GPUs after it
        return None

    pairs = pick(list(gpus), [])
    if pairs is None:
        return None
    order = [g for p in pairs for g in p]
    return order + [g for g in gpus if g not in order][:n - len(order)]


def cpu_name() -> str:
    """The host CPU's model ("AMD EPYC 9454 48-Core Processor"), from /proc/cpuinfo where there is one."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def usable_cpus() -> Optional[int]:
    """The CPUs this process may run on (its affinity), None where the platform does not say."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def host_info() -> dict:
    """What a run report records of its host, whose CPU sets a launch-bound step: the CPU's model, its logical CPUs and
    those this process may run on."""
    return {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "usable_cpus": usable_cpus()}


def no_bridges_fix(profile_name: str) -> str:
    """The fix for a node whose cards are not bridged as a bridged profile assumes."""
    return (f"re-plan with a copy of {profile_name}'s profile without nvlink.bridge_gbytes_per_s and bridge_efficiency "
            "(--hardware PATH)")


# --- the node's network: what NCCL can run across nodes on (sysfs, Linux) ---

_RATE = re.compile(r"([\d.]+)\s*Gb/sec")
# a node's NICs below this share of a plan's (or a profile's) inter-node rate a GPU are said to be short of it
NIC_SHORTFALL = 0.9
# nvidia-smi's memory.total against the profile's hbm_gbytes (the shipped NVIDIA profiles but GB200's hold their card's
# own reading, so a card of the profile's kind differs by none): past this share, `hardware detect` says so
MEMORY_MISMATCH = 0.02


@dataclass(frozen=True)
class NetPort:
    name: str  # "mlx5_0/1" (an RDMA device's port) or "eth0"
    gbits: float  # line rate, Gb/s a direction
    kind: str  # "InfiniBand" or "Ethernet" (RoCE) for an RDMA port, "TCP" for an Ethernet interface


def _read(path) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def _entries(folder: str) -> list[str]:
    """The names in a sysfs folder, sorted; [] where it is missing or unreadable."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def nccl_selects(spec: Optional[str]):
    """NCCL's interface filter (NCCL_IB_HCA, NCCL_SOCKET_IFNAME) as a test of (name, port): a comma-separated list of
    name prefixes, "=" before the list for exact names, "^" before it (and before "=") to exclude them, ":port" after
    a device to take that port alone (NCCL's environment variables, its user guide); unset or empty: everything."""
    if not spec or not spec.strip():
        return lambda name, port=None: True
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = [(e.partition(":")[0], e.partition(":")[2] or None) for e in (x.strip() for x in spec.split(",")) if e]

    def selects(name: str, port: Optional[str] = None) -> bool:
        hit = any((name == dev if exact else name.startswith(dev)) and (want is None or port == want)
                  for dev, want in entries)
        return hit != exclude
    return selects


def rdma_ports(root: str = "/sys/class/infiniband", env: Optional[dict] = None) -> list[NetPort]:
    """Active ports of the node's RDMA devices (InfiniBand, RoCE, and any other verbs device: what NCCL's IB
    transport runs on), each at the rate its `rate` file says ("400 Gb/sec (4X NDR)"); those NCCL_IB_HCA selects,
    none where NCCL_IB_DISABLE is 1 (env: the job's environment, os.environ by default)."""
    env = os.environ if env is None else env
    out = []
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return out
    selects = nccl_selects(env.get("NCCL_IB_HCA"))
    for dev in _entries(root):
        ports_dir = os.path.join(root, dev, "ports")
        for port in sorted(_entries(ports_dir), key=lambda p: (len(p), p)):
            if not selects(dev, port):
                continue
            here = os.path.join(ports_dir, port)
            m = _RATE.search(_read(os.path.join(here, "rate")))
            if "ACTIVE" not in _read(os.path.join(here, "state")) or not m:
                continue
            out.append(NetPort(f"{dev}/{port}", float(m.group(1)), _read(os.path.join(here, "link_layer"))
                               or "InfiniBand"))
    return out


def ethernet_ports(root: str = "/sys/class/net", env: Optional[dict] = None) -> list[NetPort]:
    """The node's physical network interfaces that are up (a `device` link: not lo, bridges or veths), at their
    `speed` (Mb/s; unknown speeds left out), those NCCL_SOCKET_IFNAME selects: what NCCL's sockets run on without
    RDMA."""
    selects = nccl_selects((os.environ if env is None else env).get("NCCL_SOCKET_IFNAME"))
    out = []
    for name in _entries(root):
        here = os.path.join(root, name)
        if not selects(name):
            continue
        if not os.path.exists(os.path.join(here, "device")) or _read(os.path.join(here, "operstate")) != "up":
            continue
        speed = _read(os.path.join(here, "speed"))
        if speed.lstrip("-").isdigit() and int(speed) > 0:
            out.append(NetPort(name, int(speed) / 1000, "TCP"))
    return out


def node_network(sys_root: str = "/sys", env: Optional[dict] = None) -> list[NetPort]:
    """The ports NCCL would run across nodes on: the active RDMA ports NCCL_IB_HCA selects, else the Ethernet
    interfaces up that NCCL_SOCKET_IFNAME selects (sockets); [] where sysfs tells neither."""
    return (rdma_ports(os.path.join(sys_root, "class", "infiniband"), env)
            or ethernet_ports(os.path.join(sys_root, "class", "net"), env))


def nic_rate(ports: list[NetPort], gpus: int) -> tuple[float, float]:
    """(the ports' line rate in all, Gb/s; its share a GPU of `gpus`, GB/s a direction: what a profile's
    inter_node.gbytes_per_s means)."""
    node_gbits = sum(p.gbits for p in ports)
    return node_gbits, node_gbits / 8 / gpus


def describe_ports(ports: list[NetPort]) -> str:
    """'8 x 400 Gb/s InfiniBand' (ports grouped by rate and kind, largest group first)."""
    groups: dict[tuple[float, str], int] = {}
    for p in ports:
        groups[(p.gbits, p.kind)] = groups.get((p.gbits, p.kind), 0) + 1
    return " + ".join(f"{n} x {g:g} Gb/s {k}" for (g, k), n in sorted(groups.items(), key=lambda x: (-x[1], -x[0][0])))


# --- `parplan hardware detect`: this node against the profile its GPUs match ---

SMI_QUERY = ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]


def parse_smi_gpus(text: str) -> list[tuple[int, str, int]]:
    """(index, name, MiB) of each GPU in `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
            out.append((int(parts[0]), parts[1], int(parts[2])))
    return out


def read_smi_gpus(timeout: float = TOPO_TIMEOUT_S) -> tuple[list[tuple[int, str, int]], str]:
    """This node's GPUs by nvidia-smi, or ([], why)."""
    gpus, why = _nvidia_smi(SMI_QUERY, parse_smi_gpus, "GPU", timeout)
    return gpus or [], why


def links_said(topo: Optional[Topology], gpus: list[int]) -> tuple[str, str]:
    """(kind, words) of how NVLink joins `gpus`: "all" (every pair: a switch or a full mesh), "pairs" (some pairs:
    bridges), "none" (PCIe only), "unknown" (no matrix)."""
    if topo is None:
        return "unknown", "not read (no nvidia-smi topo -m)"
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    linked = [(a, b) for a, b in pairs if topo.nvlinked(a, b)]
    if not pairs or not linked:
        return "none", "no NVLink between them (PCIe)" if pairs else "one GPU"
    if len(linked) == len(pairs):
        kinds = sorted({topo.link(a, b) for a, b in linked})
        return "all", f"NVLink between every pair ({', '.join(kinds)})"
    return "pairs", "NVLink between " + ", ".join(f"{a}-{b} ({topo.link(a, b)})" for a, b in linked) + " only"


def detect_node(gpus: list[tuple[int, str, int]], topo: Optional[Topology], ports: list[NetPort]) -> dict:
    """This node (nvidia-smi's GPUs, its topology matrix, its NICs) against the shipped profile its GPU's name matches
    (calibrate's base for it): what differs, and the `recommend` flags that plan for the node as it is."""
    import hardware_profiles

    from .calibrate import base_for_device
    name = gpus[0][1]
    profile_name, matched = base_for_device(name)
    prof = hardware_profiles.load_profile(profile_name)
    indices = [g[0] for g in gpus]
    kind, links = links_said(topo, indices)
    node_gbits, per_gpu = nic_rate(ports, len(gpus)) if ports else (None, None)
    flags, notes = [f"--hardware {profile_name}"], []
    if not matched:
        notes.append(f"no shipped profile for {name}: measure one with `parplan calibrate --out my-gpu.toml` "
                     f"(its base would be {profile_name}), then --hardware my-gpu.toml")
    if len({g[1] for g in gpus}) > 1:
        notes.append("the GPUs differ (" + ", ".join(sorted({g[1] for g in gpus})) + "): planned as the first's")
    here_gb = gpus[0][2] * 2**20 / 1e9
    if here_gb > 0 and abs(here_gb / prof.hbm_gbytes - 1) > MEMORY_MISMATCH:
        notes.append(f"{here_gb:.1f} GB a GPU here ({gpus[0][2]:,} MiB) where {profile_name} plans {prof.hbm_gbytes:g}: "
                     f"its plans {'may not fit' if here_gb < prof.hbm_gbytes else 'leave memory unused'} on this GPU; "
                     "`parplan calibrate` writes this GPU's own memory into its profile")
    if len(gpus) < prof.gpus_per_node:
        flags.append(f"--gpus-per-node {len(gpus)}")
        notes.append(f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} here where {profile_name}'s node has {prof.gpus_per_node}")
    nv = prof.nvlink
    if nv.bridge_gbytes_per_s and kind == "none" and len(gpus) > 1:
        notes.append(f"{profile_name} bridges its cards in pairs and these have no NVLink: "
                     f"{no_bridges_fix(profile_name)}")
    elif nv.bridge_gbytes_per_s and kind == "pairs" and topo is not None:
        order = bridged_order(topo, indices, len(indices))
        if order is None:
            notes.append(f"not every GPU here has a bridged partner ({links}): a pair of ranks on two of them runs at "
                         "the PCIe rate, not the bridge's the plan prices (`parplan launch` checks the pairs a plan uses)")
        elif order != indices[:len(order)]:
            notes.append(f"the bridged pairs are not GPUs (0, 1), (2, 3), ...: launch with CUDA_DEVICE_ORDER=PCI_BUS_ID "
                         f"CUDA_VISIBLE_DEVICES={','.join(map(str, order))} (`parplan launch` checks it)")
    elif not nv.bridge_gbytes_per_s and not nv.efficiency_by_group_size and kind in ("none", "pairs") and len(gpus) > 1:
        notes.append(f"{profile_name}'s node joins every GPU by NVLink ({nv.gbytes_per_s:g} GB/s) and this one does not "
                     f"({links}): its in-node collectives are slower than planned; measure them with `parplan calibrate`")
    if per_gpu is not None and per_gpu < NIC_SHORTFALL * prof.inter_node.gbytes_per_s:
        flags.append(f"--inter-node-bandwidth {per_gpu:.3g}")
        notes.append(f"this node's NICs give {per_gpu:.3g} GB/s a GPU across nodes, {profile_name} "
                     f"{prof.inter_node.gbytes_per_s:g}" + ("; over TCP sockets (no RDMA port NCCL would use), slower still"
                                                             if ports[0].kind == "TCP" else ""))
    return {"gpus": len(gpus), "gpu_name": name, "memory_mib": gpus[0][2], "profile": profile_name,
            "profile_matched": matched, "links": kind, "links_said": links,
            "nics": describe_ports(ports) if ports else None, "nic_gbits": node_gbits,
            "inter_node_gbytes_per_gpu": None if per_gpu is None else float(f"{per_gpu:.4g}"),
            "recommend_flags": flags, "notes": notes}
