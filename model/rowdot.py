"""The row-invariant CPU kernels: the product of model/rowdot.c and the attention of
model/attend.c, built together with the machine's C compiler on first use, kept in a folder
keyed by the hash of their sources and flags, loaded with ctypes.  Which of
its kinds runs a dtype is fixed per process by the CPU's flags (AVX-512 where it has it, with
bf16 dot products where it has those; else AVX2), and named by `name()`.  Knows nothing of
models or layers; `lib()` is None where there is no x86-64 CPU with AVX2 and FMA, no compiler,
or no writable folder (model/linear.py then falls back to padding)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(f) for f in ("rowdot.c", "packed.c", "attend.c", "pointwise.c"))
HEADERS = (Path(__file__).with_name("lanes.h"),)
#: no fast-math and no contraction: the only fused operations are the source's explicit FMAs;
#: OpenMP for threads, whose libgomp.so.1 resolves to the one torch has loaded (one pool for both)
FLAGS = ("-O3", "-mavx2", "-mfma", "-fno-fast-math", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp")
#: the dtypes it reads (weights and activations alike); it accumulates and writes fp32
DTYPES = (torch.float32, torch.bfloat16)


def _key() -> str:
    return hashlib.sha256(b"".join(f.read_bytes() for f in SOURCES + HEADERS) + " ".join(FLAGS).encode()).hexdigest()[:16]


def _folders() -> list[Path]:
    """Where a build may be kept, the first writable one taken: beside the package (gitignored
    .cache/), the user's cache, the temporary folder."""
    return [Path(__file__).resolve().parents[1] / ".cache" / "kernels", Path.home() / ".cache" / "setflow" / "kernels",
            Path(tempfile.gettempdir()) / "setflow-kernels"]


@lru_cache(maxsize=1)
def _flags() -> frozenset[str]:
    """The CPU's instruction-set flags that matter here (none off x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        flags = set(next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("flags")), []))
    except OSError:  # no /proc: what torch dispatches to says as much
        cap = torch.backends.cpu.get_cpu_capability()
        flags = {"avx2", "fma"} if cap in ("AVX2", "AVX512") else set()
    return frozenset(flags & {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"})


#: the kinds whose products read packed weights (model/packed.c), and each one's dtype: bf16 by
#: bf16 dot products (3, AVX-512 BF16); fp32 by FMAs in k's order (5, AVX2 or AVX-512), bf16
#: widened to fp32 and so (6, AVX2); bf16 by AMX tiles (7)
PACKED = {3: torch.bfloat16, 5: torch.float32, 6: torch.bfloat16, 7: torch.bfloat16}


def avx512() -> bool:
    """Has this CPU the AVX-512 (F, BW, VL) that kinds 1 and 3 need?  (model/attend.c asks
    the CPU itself which of its two codes to run: the same arithmetic either way.)"""
    return {"avx512f", "avx512bw", "avx512vl"} <= _flags()


def runs(kind: int) -> bool:
    """Can this CPU run `kind` (the kernel built)?  0, 5, 6: AVX2 and FMA; 1: AVX-512 (F, BW,
    VL); 3: and AVX-512 BF16; 7: and AMX-BF16, its tiles granted to this process by Linux."""
    f, dll = _flags(), lib()
    if dll is None:
        return False
    needs = {0: True, 5: True, 6: True, 1: avx512(), 3: avx512() and "avx512_bf16" in f,
             7: avx512() and {"avx512_bf16", "amx_tile", "amx_bf16"} <= f}
    return needs.get(kind, False) and (kind != 7 or bool(dll.amx_ready()))


@lru_cache(maxsize=1)
def kinds() -> dict[torch.dtype, int]:
    """The kernel's kind for each dtype on this CPU.  fp32: packed weights, FMAs in k's order (5;
    16 columns a vector with AVX-512, 8 with AVX2: the same chains).  bf16: AMX tiles (7) where
    the CPU runs them; else bf16 dot products (3) with AVX-512 BF16; else widened to fp32 and as
    kind 5 (6).  (Kinds 0 and 1, the dot order over weights in place by AVX2 and AVX-512 FMAs,
    are what such CPUs ran before: kept for the tests and harnesses that compare.)"""
    return {torch.float32: 5, torch.bfloat16: next((k for k in (7, 3) if runs(k)), 6)}


def packs(dtype: torch.dtype) -> bool:
    """Do this CPU's products of `dtype` read packed weights (pack())?"""
    return kinds().get(dtype) in PACKED


def _build(cc: str, folder: Path, so: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{so.name}.{os.getpid()}"
    subprocess.run([cc, *FLAGS, "-o", str(tmp), *map(str, SOURCES)], check=True, capture_output=True, timeout=120)
    os.replace(tmp, so)  # atomic: another process building the same source finds a whole file


@lru_cache(maxsize=1)
def lib() -> ctypes.CDLL | None:
    """The loaded kernel, built once per source and flags; None where it cannot be (logged)."""
    if not {"avx2", "fma"} <= _flags():
        log.info("rowdot: this CPU has no AVX2+FMA: linear layers pad their products instead")
        return None
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        log.warning("rowdot: no C compiler (gcc): linear layers pad their products instead (slower)")
        return None
    so_name = f"rowdot-{_key()}.so"
    for folder in _folders():
        so = folder / so_name
        try:
            if not so.exists():
                _build(cc, folder, so)
            dll = ctypes.CDLL(str(so))
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("rowdot: cannot build or load %s (%s)", so, e)
            continue
        dll.rowdot.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_int]
        dll.rowdot.restype = ctypes.c_int
        dll.attend.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 2 + [ctypes.c_long] * 17 + [ctypes.c_float,
                                                                                                 ctypes.c_int]
        dll.attend.restype = ctypes.c_int
        dll.attend_ragged.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 2 + [ctypes.c_long] * 5
                                      + [ctypes.c_void_p] * 4 + [ctypes.c_long] * 6 + [ctypes.c_float, ctypes.c_int])
        dll.attend_ragged.restype = ctypes.c_int
        dll.packed_size.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_int]  # n, k, kind
        dll.packed_size.restype = ctypes.c_long
        dll.pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
        dll.pack.restype = None
        dll.rowdot_packed.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_int]
        dll.rowdot_packed.restype = ctypes.c_int
        dll.amx_ready.argtypes, dll.amx_ready.restype = [], ctypes.c_int
        dll.norm_rows.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_float, ctypes.c_int, ctypes.c_int]
        dll.norm_rows.restype = ctypes.c_int
        dll.norm_rope.argtypes = ([ctypes.c_void_p] * 2 + [ctypes.c_long] * 5 + [ctypes.c_void_p] * 4 + [ctypes.c_long]
                                  + [ctypes.c_void_p] * 2 + [ctypes.c_float, ctypes.c_int, ctypes.c_int])
        dll.norm_rope.restype = ctypes.c_int
        dll.packed_avx512.argtypes, dll.packed_avx512.restype = [ctypes.c_int], None
        return dll
    return None


def name() -> str:
    """The kernel's identity, part of what a row's bits depend on: "rowdot-<hash of source and
    flags>-<fp32's kind><bf16's kind>", and where bf16 runs on AMX (kind 7, whose sums the
    hardware fixes) "-cpu<family>.<model>" after it; or "" where it is not available (products
    then pad, model/linear.py)."""
    if lib() is None:
        return ""
    k = kinds()
    return f"rowdot-{_key()[:8]}-{k[torch.float32]}{k[torch.bfloat16]}" + (f"-cpu{_cpu()}" if k[torch.bfloat16] == 7 else "")


def _cpu() -> str:
    """This CPU's "<family>.<model>" from /proc/cpuinfo ("?" where it cannot be read)."""
    try:
        info = {a.strip(): b.strip() for a, b in (line.split(":", 1) for line in
                                                   Path("/proc/cpuinfo").read_text().splitlines()[:32] if ":" in line)}
        return f"{info['cpu family']}.{info['model']}"
    except (OSError, KeyError):
        return "?"


def pack(w: Tensor) -> Tensor:
    """w (N, K) bfloat16 or float32, contiguous on the CPU -> its panels for this CPU's kind of
    its dtype (model/packed.c), a flat tensor of its dtype: what product() reads.  The caller
    checks lib() and packs() first."""
    dll = lib()
    assert dll is not None, "rowdot is not available here"
    assert packs(w.dtype) and w.dim() == 2 and w.is_contiguous() and w.device.type == "cpu"
    (n, k), kind = w.shape, kinds()[w.dtype]
    out = torch.empty(dll.packed_size(n, k, kind), dtype=w.dtype)
    _huge_pages(out)
    dll.pack(w.data_ptr(), out.data_ptr(), n, k, kind)
    return out


_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def _huge_pages(t: Tensor) -> None:
    """Ask Linux to back the whole 2 MiB pages inside t's memory with huge pages (madvise
    MADV_HUGEPAGE, which transparent huge pages in their "madvise" mode wait for), before its
    first write backs it: a product streaming its weights then meets a TLB miss and a stop of
    the hardware prefetch every 2 MiB, not every 4 KiB.  Best effort: nothing where the call
    fails or the OS has no such pages."""
    libc = _libc() if platform.system() == "Linux" else None
    a, b = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    lo, hi = -(-a // _HUGE) * _HUGE, b // _HUGE * _HUGE
    if libc is not None and hi > lo:
        libc.madvise(lo, hi - lo, _MADV_HUGEPAGE)


def product(x: Tensor, w: Tensor, threads: int, out: torch.dtype = torch.float32, packed: Tensor | None = None,
            n: int | None = None) -> Tensor:
    """x (M, K) and w (N, K), float32 or bfloat16, contiguous on the CPU -> x w^T (M, N) in `out`
    (float32, or bfloat16 rounded to nearest even as `.to(torch.bfloat16)` rounds), each element
    reduced in one order of this CPU's kind for x's dtype over `threads` threads (split over N).
    The packed kinds read w's panels: `packed` (pack(w), kept by the caller), else packed now;
    `n`: the columns of `packed` where they are not w's (panels of several weights side by side,
    model/linear.py fused; w then only names the dtype and K).  The caller checks lib() first."""
    dll = lib()
    assert dll is not None, "rowdot is not available here"
    assert x.dtype in DTYPES and w.dtype in DTYPES and x.is_contiguous() and w.is_contiguous()
    assert out in DTYPES, f"rowdot writes float32 or bfloat16, not {out}"
    (m, k) = x.shape
    n = w.shape[0] if n is None else n
    assert w.shape[1] == k, f"x {tuple(x.shape)} and w {tuple(w.shape)} do not multiply"
    assert n == w.shape[0] or packed is not None and kinds()[x.dtype] in PACKED and x.dtype == w.dtype, \
        "other columns than w's only from packed panels"
    kind = kinds()[x.dtype] if x.dtype == w.dtype else 0
    if x.dtype != torch.float32 and kind not in (3, 7):
        x = x.float()  # exact: every kind but 3 and 7 reads its rows in fp32
    y = torch.empty(m, n, dtype=out)
    if kind in PACKED:
        pw = pack(w) if packed is None else packed
        assert pw.dtype == w.dtype and pw.numel() == dll.packed_size(n, k, kind), "packed weights of another shape"
        bad = dll.rowdot_packed(x.data_ptr(), pw.data_ptr(), y.data_ptr(), int(out == torch.bfloat16), kind,
                                m, k, n, threads)
        if bad == -2:
            raise MemoryError(f"rowdot: no room for {m} rows of {k}")
        assert bad == 0, f"rowdot_packed refused kind {kind}"
        return y
    bad = dll.rowdot(x.data_ptr(), w.data_ptr(), kind, int(w.dtype == torch.bfloat16), y.data_ptr(),
                     int(out == torch.bfloat16), m, k, n, threads)
    assert bad == 0, f"rowdot refused kind {kind}"
    return y


def attends(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> bool:
    """Does attend() run this call here: CPU tensors of one dtype of DTYPES, d (and the mask's
    keys) contiguous, an additive fp32 or bf16 mask (B|1, 1, T, S), no autograd, and the
    kernel built (AVX2 and FMA; attend.c runs AVX-512 where the CPU has it, the same
    arithmetic)?  (attend_ragged() asks the same of its operands, its mask flat.)"""
    return ((mask.dim() == 4 and mask.shape[1] == 1 or mask.dim() == 1)
            and q.device.type == "cpu" and q.dtype in DTYPES and k.dtype == v.dtype == q.dtype
            and mask.dtype in DTYPES and lib() is not None
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == mask.stride(-1) == 1
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, threads: int) -> Tensor:
    """q (B, H, T, D) over k, v (B, Hkv, S, D) under the additive mask (B|1, 1, T, S) -> (B, H,
    T, D) in q's dtype (a view of a (B, T, H, D) tensor), each query row by model/attend.c's one
    order over the keys it attends.  The caller checks attends() first."""
    dll = lib()
    assert dll is not None
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    assert k.shape == v.shape == (B, Hkv, S, D) and mask.shape[-2:] == (T, S) and mask.shape[0] in (1, B)
    out = torch.empty(B, T, H, D, dtype=q.dtype)
    (qsb, qsh, qst, _), (ksb, ksh, kss, _), (vsb, vsh, vss, _) = q.stride(), k.stride(), v.stride()
    msb = 0 if mask.shape[0] == 1 else mask.stride(0)
    bad = dll.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr(), out.data_ptr(),
                     int(q.dtype == torch.bfloat16), int(mask.dtype == torch.bfloat16), B, T, H, Hkv, S, D,
                     qsb, qst, qsh, ksb, kss, ksh, vsb, vss, vsh, msb, mask.stride(2), D ** -0.5, threads)
    if bad == -2:
        raise MemoryError(f"attend: no room for {S} keys of {D}")
    assert bad == 0, f"attend refused {H} heads over {Hkv}"
    return out.transpose(1, 2)


def attend_ragged(q: Tensor, k: Tensor, v: Tensor, slots: Tensor, counts: list[int], sizes: list[int],
                  mask: Tensor, threads: int) -> Tensor:
    """B sequences in one call: q (N, H, D) their queries packed (sequence b's counts[b] rows
    after the earlier ones'), k, v (slots, Hkv, D) a pool's flat keys and values, slots (sum
    sizes,) long: sequence b's sizes[b] key slots in order, after the earlier ones'; mask: the
    sequences' additive masks (counts[b] x sizes[b], row-major) one after another, flat ->
    (N, H, D) in q's dtype, each row the very bits attend() gives it over those keys gathered.
    The caller checks attends() on the same dtypes first."""
    dll = lib()
    assert dll is not None
    N, H, D = q.shape
    Hkv = k.shape[1]
    assert k.shape == v.shape and k.shape[2] == D and slots.dtype == torch.long and slots.is_contiguous()
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and mask.is_contiguous() and len(counts) == len(sizes)
    qo, so, mo = [0], [0], [0]
    for c, s in zip(counts, sizes):
        qo.append(qo[-1] + c)
        so.append(so[-1] + s)
        mo.append(mo[-1] + c * s)
    assert qo[-1] == N and so[-1] == slots.numel() and mask.numel() == mo[-1]
    offsets = torch.tensor(qo + so + mo[:-1], dtype=torch.long)
    B = len(counts)
    p = offsets.data_ptr()
    out = torch.empty(N, H, D, dtype=q.dtype)
    bad = dll.attend_ragged(q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr(), out.data_ptr(),
                            int(q.dtype == torch.bfloat16), int(mask.dtype == torch.bfloat16), B, H, Hkv,
                            max(sizes, default=0), D, p, p + 8 * (B + 1), slots.data_ptr(), p + 16 * (B + 1),
                            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                            D ** -0.5, threads)
    if bad == -2:
        raise MemoryError(f"attend: no room for {max(sizes)} keys of {D}")
    assert bad == 0, f"attend refused {H} heads over {Hkv}"
    return out


def _pointwise(*ts: Tensor) -> bool:
    """Does model/pointwise.c take these operands: the kernel built, CPU tensors of one dtype of
    DTYPES, no autograd?"""
    return (lib() is not None and all(t.device.type == "cpu" and t.dtype == ts[0].dtype for t in ts)
            and ts[0].dtype in DTYPES and not (torch.is_grad_enabled() and any(t.requires_grad for t in ts)))


def _rows(x: Tensor) -> tuple[int, int] | None:
    """x's rows (all but its last dim) as (count, stride in elements), where they lie evenly
    apart with unit stride inside; None otherwise (or where there are none)."""
    if x.numel() == 0 or x.stride(-1) != 1:
        return None
    try:
        view = x.view(-1, x.shape[-1])
    except RuntimeError:
        return None
    return view.shape[0], view.stride(0)


def norm(x: Tensor, w: Tensor, eps: float, threads: int) -> Tensor | None:
    """RMSNorm of x's rows with weight w (x's width) in x's dtype, each row by model/pointwise.c's
    one order -> a new contiguous tensor of x's shape; None where the kernel does not take them
    (_pointwise) or x's rows do not lie one stride apart: the caller computes it otherwise."""
    dll = lib()
    shape = _rows(x) if _pointwise(x, w) and w.dim() == 1 and w.is_contiguous() and x.shape[-1] == w.shape[0] else None
    if dll is None or shape is None:
        return None
    rows, rs = shape
    y = torch.empty(x.shape, dtype=x.dtype)
    dll.norm_rows(x.data_ptr(), rs, rows, x.shape[-1], w.data_ptr(), y.data_ptr(), eps, int(x.dtype == torch.bfloat16),
                  threads)
    return y


def norm_rope(q: Tensor, k: Tensor, wq: Tensor, wk: Tensor, cos: Tensor, sin: Tensor, eps: float,
              threads: int) -> tuple[Tensor, Tensor] | None:
    """q (..., H * D) and k (..., Hkv * D), rows of one stride (views of one product's output) ->
    their heads' RMSNorms (weights wq, wk (D,)) then rotary embedding at cos, sin (..., D / 2,
    rows of one stride), each row by model/pointwise.c's order: (..., H, D) and (..., Hkv, D),
    new and contiguous; None where the kernel does not take them (_pointwise: it reads all of
    them in q's dtype) or the rows do not lie one stride apart alike."""
    dll = lib()
    D = wq.shape[0]
    if (dll is None or not _pointwise(q, k, wq, wk, cos, sin) or wk.shape != wq.shape or not wq.is_contiguous()
            or not wk.is_contiguous() or q.shape[-1] % D or k.shape[-1] % D):
        return None
    rq, rk, rc, rsn = _rows(q), _rows(k), _rows(cos), _rows(sin)
    if rq is None or rk is None or rc is None or rsn is None or not rq[0] == rk[0] == rc[0] == rsn[0]:
        return None
    rows, rs = rq
    if rows > 1 and (rk[1] != rs or rc[1] != rsn[1]):  # one stride for q and k, one for cos and sin
        return None
    H, Hkv = q.shape[-1] // D, k.shape[-1] // D
    yq = torch.empty(*q.shape[:-1], H, D, dtype=q.dtype)
    yk = torch.empty(*k.shape[:-1], Hkv, D, dtype=k.dtype)
    bad = dll.norm_rope(q.data_ptr(), k.data_ptr(), rs, rows, H, Hkv, D, wq.data_ptr(), wk.data_ptr(), cos.data_ptr(),
                        sin.data_ptr(), rc[1], yq.data_ptr(), yk.data_ptr(), eps, int(q.dtype == torch.bfloat16), threads)
    return (yq, yk) if bad == 0 else None
