r"""Read PTX: which instructions touch global memory, for which argument, how wide.

PTX is the virtual instruction set NVRTC emits: each global load or store is
one instruction per thread per access, so counting them (and their widths)
shows how often each tensor is read or written. A load or store is
attributed to the kernel argument its address comes from, by following the
address register back to the ``ld.param.u64`` that loaded the pointer.
``ptxas`` (in the pinned ``nvidia-cuda-nvcc-cu12`` wheel) assigns the real
registers and reports them, with spills and shared memory.

Examples
--------
>>> from lnorm.gpu.kernels import compile_ptx, kernel_params
>>> name = "layernorm_forward.cu"
>>> reports = inspect_ptx(compile_ptx(name), kernel_params(name))
>>> reports["ln_fwd_warp_f32_v4"].per_argument("ld")  # (loads, bytes) per thread
{'x': (4, 64), 'gamma': (4, 64), 'beta': (4, 64)}
"""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .kernels import KERNEL_FILES, compile_ptx, kernel_params

__all__ = [
    "MemoryOp",
    "KernelPTX",
    "PtxasUsage",
    "entries",
    "inspect_ptx",
    "inspect_kernels",
    "ptxas_path",
    "ptxas_usage",
]

_ENTRY = re.compile(
    r"^\.visible \.entry (\w+)\((.*?)\)\s*(.*?)^\{(.*?)^\}", re.M | re.S
)
_PARAM = re.compile(r"\.param \.(\w+) (\w+)")
_SHARED_DECL = re.compile(
    r"\.shared\s+(?:\.align \d+\s+)?\.[bfus](\d+)\s+(\w+)\[(\d+)\]"
)
_LOCAL_DECL = re.compile(r"\.local\s+(?:\.align \d+\s+)?\.[bfus](\d+)\s+\w+\[(\d+)\]")
_GUARD = re.compile(r"^@!?%\w+\s+")
_REG = re.compile(r"%\w+")


@dataclass(frozen=True)
class MemoryOp:
    """Describe one global load or store instruction."""

    kind: str
    argument: str
    vector: int
    bits: int
    in_loop: bool
    offset: int

    @property
    def bytes(self) -> int:
        """Return the bytes one thread moves with this instruction."""
        return self.vector * self.bits // 8


@dataclass(frozen=True)
class KernelPTX:
    r"""Hold what the PTX of one kernel says about memory traffic and synchronization.

    Made by :func:`lnorm.gpu.ptx.inspect_ptx`.

    Examples
    --------
    >>> ptx = "\n".join([
    ...     ".visible .entry copy(.param .u64 src, .param .u64 dst)",
    ...     "{",
    ...     "ld.param.u64 %rd1, [src];",
    ...     "ld.param.u64 %rd2, [dst];",
    ...     "ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];",
    ...     "st.global.v4.f32 [%rd2+16], {%f1, %f2, %f3, %f4};",
    ...     "ret;",
    ...     "}"])
    >>> k = inspect_ptx(ptx)["copy"]
    >>> k.params, k.param_types, k.shared_bytes, k.max_threads
    (('src', 'dst'), ('u64', 'u64'), 0, None)
    """

    name: str
    params: tuple[str, ...]
    param_types: tuple[str, ...]
    memory_ops: tuple[MemoryOp, ...]
    shared_bytes: int
    local_bytes: int
    max_threads: int | None
    opcodes: Counter
    lines: tuple[str, ...]

    def ops(
        self, kind: str, argument: str | None = None, *, in_loop: bool | None = None
    ) -> list[MemoryOp]:
        """Select the loads or stores, optionally of one argument, in loops or not."""
        return [
            op
            for op in self.memory_ops
            if op.kind == kind
            and (argument is None or op.argument == argument)
            and (in_loop is None or op.in_loop == in_loop)
        ]

    def per_argument(
        self, kind: str, *, in_loop: bool | None = None
    ) -> dict[str, tuple[int, int]]:
        """Count what one thread loads or stores of each argument."""
        out: dict[str, tuple[int, int]] = {}
        for op in self.ops(kind, in_loop=in_loop):
            n, b = out.get(op.argument, (0, 0))
            out[op.argument] = (n + 1, b + op.bytes)
        return out

    def count(self, prefix: str) -> int:
        r"""Count the instructions whose opcode starts with ``prefix``.

        Examples
        --------
        >>> from lnorm.gpu.kernels import compile_ptx, kernel_params
        >>> name = "layernorm_backward.cu"
        >>> reports = inspect_ptx(compile_ptx(name), kernel_params(name))
        >>> k = reports["ln_bwd_reduce_params"]
        >>> k.count("atom"), k.count("fma")  # no atomics; --fmad=false: no fma
        (0, 0)
        """
        return sum(n for op, n in self.opcodes.items() if op.startswith(prefix))


def _instructions(body: str) -> list[str]:
    """The body's lines, guards (``@%p1``) removed, labels and declarations kept."""
    return [_GUARD.sub("", ln.strip()) for ln in body.splitlines()]


def _loop_lines(lines: list[str]) -> set[int]:
    """Indices of lines inside a loop: from a label to a later branch back to it."""
    seen: dict[str, int] = {}
    inside: set[int] = set()
    for i, line in enumerate(lines):
        if re.fullmatch(r"\$\w+:", line):
            seen[line[:-1]] = i
        target = re.fullmatch(r"bra(?:\.uni)?\s+(\$\w+);", line)
        if target and target.group(1) in seen:
            inside.update(range(seen[target.group(1)], i + 1))
    return inside


def _pointer_origins(lines: list[str], pointers: set[str]) -> dict[str, set[str]]:
    """For each register, the pointer parameters its value is computed from."""
    origin: dict[str, set[str]] = {}
    for _ in range(16):
        changed = False
        for line in lines:
            op, _, rest = line.partition(" ")
            if not op or op[0] in ".$/{}" or op.startswith(
                ("st.", "bra", "bar.", "ret", "setp")
            ):
                continue
            regs = _REG.findall(rest)
            if not regs:
                continue
            if op.startswith("ld.param"):
                param = re.search(r"\[(\w+)\]", rest)
                new = {param.group(1)} & pointers if param else set()
            elif op.startswith("ld."):
                continue
            else:
                new = set().union(*(origin.get(r, set()) for r in regs[1:]))
            if new - origin.get(regs[0], set()):
                origin.setdefault(regs[0], set()).update(new)
                changed = True
        if not changed:
            return origin
    raise RuntimeError("pointer origins did not converge")


def _width(suffixes: str) -> tuple[int, int]:
    parts = suffixes.split(".")
    vector = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
    bits = next(
        int(p[1:]) for p in reversed(parts)
        if re.fullmatch(r"[bfsu](8|16|32|64|128)", p)
    )
    return vector, bits


def _inspect_entry(
    name, param_block, directives, body, module_shared, names
) -> KernelPTX:
    ptx_params = _PARAM.findall(param_block)
    if names is not None and len(names) != len(ptx_params):
        raise ValueError(
            f"{name}: {len(names)} argument names for {len(ptx_params)} PTX parameters."
        )
    label = {p: (names[i] if names else p) for i, (_, p) in enumerate(ptx_params)}
    pointers = {p for t, p in ptx_params if t == "u64"}

    lines = _instructions(body)
    loops = _loop_lines(lines)
    origin = _pointer_origins(lines, pointers)
    memory_ops = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"(ld|st)\.global((?:\.\w+)*)\s+(.*);", line)
        copy = re.fullmatch(
            r"cp\.async\.c[ag]\.shared\.global(?:\.\w+)*\s+\[[^]]*\],\s*(\[[^]]*\]),"
            r"\s*(\d+)\s*;", line)
        if copy:  # the source operand is the global address
            kind, operands = "cp", copy.group(1)
            suffixes = f".b{8 * int(copy.group(2))}"
        elif not m:
            continue
        else:
            kind, suffixes, operands = m.groups()
        address = re.search(r"\[(%\w+)(?:\+(-?\d+))?\]", operands)
        sources = origin.get(address.group(1), set()) if address else set()
        argument = label[next(iter(sources))] if len(sources) == 1 else "?"
        offset = int(address.group(2) or 0) if address else 0
        memory_ops.append(
            MemoryOp(kind, argument, *_width(suffixes), in_loop=i in loops,
                     offset=offset)
        )

    shared = sum(int(bits) // 8 * int(n) for bits, _, n in _SHARED_DECL.findall(body))
    shared += sum(
        size for var, size in module_shared.items() if re.search(rf"\b{var}\b", body)
    )
    local = sum(int(bits) // 8 * int(n) for bits, n in _LOCAL_DECL.findall(body))
    maxntid = re.search(r"\.maxntid (\d+), (\d+), (\d+)", directives)
    max_threads = None
    if maxntid:
        max_threads = (
            int(maxntid.group(1)) * int(maxntid.group(2)) * int(maxntid.group(3))
        )
    opcodes = Counter(
        line.split()[0].rstrip(";") for line in lines if line and line[0] not in ".$/{}"
    )
    return KernelPTX(
        name=name,
        params=tuple(label[p] for _, p in ptx_params),
        param_types=tuple(t for t, _ in ptx_params),
        memory_ops=tuple(memory_ops),
        shared_bytes=shared,
        local_bytes=local,
        max_threads=max_threads,
        opcodes=opcodes,
        lines=tuple(line for line in lines if line),
    )


def entries(ptx: str) -> dict[str, str]:
    """Split a PTX module into its kernels: ``{name: the entry's text}``."""
    return {m.group(1): m.group(0) for m in _ENTRY.finditer(ptx)}


def inspect_ptx(
    ptx: str, params: dict[str, tuple[str, ...]] | None = None
) -> dict[str, KernelPTX]:
    """Inspect every kernel of a PTX module: ``{kernel name: KernelPTX}``."""
    # Static __shared__ arrays of device functions are declared at module scope;
    # a kernel uses those its body names.
    module_text = _ENTRY.sub("", ptx)
    module_shared = {
        var: int(bits) // 8 * int(n)
        for bits, var, n in _SHARED_DECL.findall(module_text)
    }
    out = {}
    for m in _ENTRY.finditer(ptx):
        name, param_block, directives, body = m.groups()
        names = params.get(name) if params else None
        out[name] = _inspect_entry(
            name, param_block, directives, body, module_shared, names
        )
    return out


def ptxas_path() -> Path | None:
    """Find ``ptxas`` in the ``nvidia-cuda-nvcc-cu12`` wheel."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except ModuleNotFoundError:  # no "nvidia" namespace package at all
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "bin" / "ptxas"
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class PtxasUsage:
    r"""Hold what ``ptxas -v`` reports for one kernel on one architecture.

    Examples
    --------
    >>> u = PtxasUsage(registers=40, spill_stores=0, spill_loads=0, stack_frame=0,
    ...                shared_bytes=0)
    >>> u.registers * 256 <= 65536  # a block of 256 threads fits the register file
    True
    """

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_bytes: int


def ptxas_usage(ptx: str, arch: str = "sm_90") -> dict[str, PtxasUsage]:
    """Assemble PTX with ``ptxas -v``: registers, spills, shared memory a kernel."""
    exe = ptxas_path()
    if exe is None:
        raise RuntimeError(
            "ptxas not found: install nvidia-cuda-nvcc-cu12 (see requirements.txt)."
        )
    return dict(_ptxas_usage(str(exe), ptx, arch))


@functools.cache
def _ptxas_usage(exe: str, ptx: str, arch: str) -> dict[str, PtxasUsage]:
    # Cached on the PTX text: a run takes seconds, and the tests, the book
    # and inspect_kernels ask for the same modules; the caller gets a copy.
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernels.ptx"
        src.write_text(ptx)
        proc = subprocess.run(
            [exe, f"-arch={arch}", "-v", str(src), "-o",
             str(Path(tmp) / "kernels.cubin")],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed for {arch}:\n{proc.stderr}")
    out = {}
    for block in re.split(r"(?=ptxas info\s+: Function properties for )", proc.stderr):
        m = re.match(r"ptxas info\s+: Function properties for (\w+)", block)
        if not m:
            continue
        frame = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
            r"(\d+) bytes spill loads",
            block,
        )
        used = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        out[m.group(1)] = PtxasUsage(
            registers=int(used.group(1)),
            spill_stores=int(frame.group(2)),
            spill_loads=int(frame.group(3)),
            stack_frame=int(frame.group(1)),
            shared_bytes=int(smem.group(1)) if smem else 0,
        )
    return out


def inspect_kernels(
    arch: str = "sm_90",
) -> tuple[dict[str, KernelPTX], dict[str, PtxasUsage] | None]:
    r"""Compile every kernel file for ``arch`` with NVRTC and inspect the result.

    Examples
    --------
    >>> reports, usage = inspect_kernels()
    >>> with_atomics = {name for name, k in reports.items() if k.count("atom")}
    >>> len(reports), with_atomics == {name for name in reports if "_atomic_" in name}
    (41, True)
    >>> usage is None or set(usage) == set(reports)
    True
    """
    reports: dict[str, KernelPTX] = {}
    usage: dict[str, PtxasUsage] | None = {} if ptxas_path() is not None else None
    for filename in KERNEL_FILES:
        text = compile_ptx(filename, arch)
        reports.update(inspect_ptx(text, kernel_params(filename)))
        if usage is not None:
            usage.update(ptxas_usage(text, arch))
    return reports, usage
