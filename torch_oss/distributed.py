"""Context parallelism: attention over a sequence split across the ranks of a
``torch.distributed`` process group.

    import torch_oss.distributed as cp

    q, k, v = (cp.shard(t, group) for t in (q_full, k_full, v_full))   # (B, H, L/P, D) each
    out = cp.ring_attention(q, k, v, group=group, is_causal=True)       # this rank's rows
    out_full = cp.unshard(out, group)

* :func:`ring_attention`: K/V blocks travel around the ring of ranks
  (``dist.batch_isend_irecv``, double buffered: the next block is in flight
  while the current one computes); each step's partial result is merged in
  float32 (float64 for float32 inputs) with the log-sum-exp rule. The backward recomputes per block and
  sends the dK/dV accumulators around the ring with K/V, so every rank's
  gradients arrive back at their owner; dQ stays local.
  ``comm="allgather"`` instead all-gathers K/V once (reduce-scatters dK/dV in
  the backward): fewer, larger messages, for grouped-query models whose K/V
  are small next to Q.
* :func:`shard`, :func:`unshard`, :func:`position_ids`: the layouts.
  ``"zigzag"`` (default) cuts the global sequence into 2P chunks and gives
  rank r chunks r and 2P-1-r, which balances causal work; ``"contiguous"``
  gives rank r the r-th of P equal pieces.
* :func:`ring_attention_context`: makes the Hugging Face
  ``attn_implementation="oss"`` attention run as ring attention over a group.

Importing this module imports ``torch.distributed`` (not needed by the rest of
torch_oss, which imports this module only when it is first used).
"""

import contextlib
import math

import torch
import torch.distributed as dist

from ._residual import output_residual_code, output_residual_value

__all__ = ["ring_attention", "allgather_attention", "shard", "unshard", "position_ids", "ring_attention_context",
           "LAYOUTS", "COMMS"]

LAYOUTS = ("zigzag", "contiguous")
COMMS = ("ring", "allgather")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# ---------------------------------------------------------------------------
# Groups and layouts
# ---------------------------------------------------------------------------


def _check_group(group, fn):
    if not dist.is_available():
        raise RuntimeError(f"torch_oss.distributed.{fn}: torch.distributed is not available in this build of PyTorch")
    if not dist.is_initialized():
        raise RuntimeError(
            f"torch_oss.distributed.{fn}: group: the default process group is not initialised; call "
            "torch.distributed.init_process_group(...) first (or pass an initialised group)"
        )
    if group is None:
        group = dist.group.WORLD
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"torch_oss.distributed.{fn}: group: this rank is not a member of the group")
    try:
        rank, size = dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"torch_oss.distributed.{fn}: group is not a usable process group: {exc}") from exc
    if rank < 0:
        raise ValueError(f"torch_oss.distributed.{fn}: group: this rank is not a member of the group")
    return group, rank, size


def _check_layout(layout, fn):
    if layout not in LAYOUTS:
        raise ValueError(f"torch_oss.distributed.{fn}: layout={layout!r} must be one of {LAYOUTS}")


def _chunks(layout, rank, size):
    """The global chunk indices this rank holds, in order, and the number of
    chunks the global sequence is cut into."""
    if layout == "zigzag":
        return (rank, 2 * size - 1 - rank), 2 * size
    return (rank,), size


def _norm_dim(x, dim, fn):
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"torch_oss.distributed.{fn}: dim={dim!r} is out of range for a {x.dim()}-D tensor")
    return dim % x.dim()


def shard(x, group=None, layout="zigzag", dim=2):
    """This rank's shard of ``x``, the full sequence along ``dim`` (2: SDPA's
    (B, H, L, D)). Its length must be divisible by P (``"contiguous"``) or 2P
    (``"zigzag"``). Returns a contiguous tensor (a copy)."""
    _check_layout(layout, "shard")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"torch_oss.distributed.shard: x must be a Tensor, got {type(x).__name__}")
    group, rank, size = _check_group(group, "shard")
    dim = _norm_dim(x, dim, "shard")
    chunks, n = _chunks(layout, rank, size)
    length = x.shape[dim]
    if length % n:
        raise ValueError(
            f"torch_oss.distributed.shard: x.shape[{dim}]={length} (the sequence) must be divisible by {n} "
            f"({'2 x ' if layout == 'zigzag' else ''}the group's {size} ranks) for layout={layout!r}"
        )
    c = length // n
    return torch.cat([x.narrow(dim, i * c, c) for i in chunks], dim=dim).contiguous()


def _reorder_gathered(parts, layout, dim):
    """The global sequence from every rank's shard (in rank order)."""
    if layout == "contiguous":
        return torch.cat(parts, dim=dim)
    size = len(parts)
    c = parts[0].shape[dim] // 2
    ordered = [None] * (2 * size)
    for r, p in enumerate(parts):
        ordered[r] = p.narrow(dim, 0, c)
        ordered[2 * size - 1 - r] = p.narrow(dim, c, c)
    return torch.cat(ordered, dim=dim)


def _all_gather_seq(x, group, size, dim):
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=group)
    return parts


def unshard(x, group=None, layout="zigzag", dim=2):
    """The full sequence from every rank's shard ``x`` (all_gather along
    ``dim``, then reordered to the global order); the inverse of :func:`shard`.
    Every rank gets the whole tensor. Carries no gradient."""
    _check_layout(layout, "unshard")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"torch_oss.distributed.unshard: x must be a Tensor, got {type(x).__name__}")
    group, rank, size = _check_group(group, "unshard")
    dim = _norm_dim(x, dim, "unshard")
    if layout == "zigzag" and x.shape[dim] % 2:
        raise ValueError(
            f"torch_oss.distributed.unshard: x.shape[{dim}]={x.shape[dim]} must be even for layout='zigzag' "
            "(a shard holds two equal chunks)"
        )
    parts = _all_gather_seq(x.detach(), group, size, dim)
    return _reorder_gathered(parts, layout, dim)


def position_ids(seq_len, group=None, layout="zigzag", device=None):
    """The global positions (int64, shape (seq_len / P,)) of this rank's tokens
    for a global sequence of ``seq_len`` tokens: what rotary embeddings need
    (``position_ids=cp.position_ids(S, group)[None]`` for a model)."""
    _check_layout(layout, "position_ids")
    if not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"torch_oss.distributed.position_ids: seq_len={seq_len!r} must be a non-negative int")
    return shard(torch.arange(seq_len, device=device), group, layout, dim=0)


# ---------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------


def _check_inputs(q, k, v, fn, layout, comm, enable_gqa, scale, softcap=0.0, sinks=None):
    from .functional import _check_kv_like_q

    _check_layout(layout, fn)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"torch_oss.distributed.{fn}: {name} must be a Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"torch_oss.distributed.{fn}: {name} must be 4-D (batch, heads, local_seq_len, head_dim), got "
                f"shape {tuple(t.shape)}"
            )
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"torch_oss.distributed.{fn}: q.dtype={q.dtype} must be one of {_FLOAT_DTYPES}")
    _check_kv_like_q(f"torch_oss.distributed.{fn}", q, k, v)
    B, Hq, L, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"torch_oss.distributed.{fn}: batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(
            f"torch_oss.distributed.{fn}: k and v must have the same heads and length, got {tuple(k.shape)} and "
            f"{tuple(v.shape)}"
        )
    if k.shape[2] != L:
        raise ValueError(
            f"torch_oss.distributed.{fn}: k.shape[2]={k.shape[2]} must equal q.shape[2]={L} (every rank holds "
            "the same tokens of q, k and v)"
        )
    if k.shape[3] != D:
        raise ValueError(f"torch_oss.distributed.{fn}: k.shape[3]={k.shape[3]} must equal q.shape[3]={D}")
    if Hq != k.shape[1]:
        if not enable_gqa:
            raise ValueError(
                f"torch_oss.distributed.{fn}: q has {Hq} heads but k and v have {k.shape[1]}; pass enable_gqa=True "
                "for grouped-query attention"
            )
        if k.shape[1] == 0 or Hq % k.shape[1]:
            raise ValueError(
                f"torch_oss.distributed.{fn}: q.shape[1]={Hq} (heads) must be a multiple of k.shape[1]={k.shape[1]} "
                "for grouped-query attention"
            )
    if layout == "zigzag" and L % 2:
        raise ValueError(
            f"torch_oss.distributed.{fn}: q.shape[2]={L} must be even for layout='zigzag' (a shard holds two equal "
            "chunks)"
        )
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise ValueError(f"torch_oss.distributed.{fn}: scale={scale!r} must be a finite number or None")
    if comm not in COMMS:
        raise ValueError(f"torch_oss.distributed.{fn}: comm={comm!r} must be one of {COMMS}")
    if (not isinstance(softcap, (int, float)) or isinstance(softcap, bool) or not math.isfinite(softcap)
            or softcap < 0):
        raise ValueError(f"torch_oss.distributed.{fn}: softcap={softcap!r} must be a finite number >= 0 (0: off)")
    if softcap and q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16) and comm == "ring":
        raise NotImplementedError(
            f"torch_oss.distributed.{fn}: softcap with {q.dtype} inputs on CUDA is not supported by the ring "
            "(its float32/float64 blocks take the block-local backward, which has no softcap term); use "
            "float16/bfloat16 or comm='allgather'")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"torch_oss.distributed.{fn}: sinks must be a Tensor or None, got {type(sinks).__name__}")
        if sinks.dim() != 1 or sinks.shape[0] != q.shape[1]:
            raise ValueError(f"torch_oss.distributed.{fn}: sinks must have shape (heads_q,) = ({q.shape[1]},), got "
                             f"{tuple(sinks.shape)}")
        if sinks.device != q.device:
            raise ValueError(f"torch_oss.distributed.{fn}: sinks is on {sinks.device} but q is on {q.device}")
        if sinks.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"torch_oss.distributed.{fn}: sinks.dtype={sinks.dtype} must be one of {_FLOAT_DTYPES}")


def _check_same_shapes(q, k, v, group, size, fn):
    """One small all_gather: every rank must hold shards of the same shape
    (unequal shards would deadlock or mis-merge the ring)."""
    if size == 1:
        return
    dev = q.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    mine = torch.tensor([*q.shape, *k.shape, v.shape[-1]], dtype=torch.int64, device=dev)
    parts = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(parts, mine, group=group)
    allv = torch.stack(parts).cpu()
    if not bool((allv == allv[0]).all()):
        lengths = allv[:, 2].tolist()
        if len(set(lengths)) > 1:
            raise ValueError(
                f"torch_oss.distributed.{fn}: q.shape[2] (the shard length) differs across ranks: {lengths}; every "
                "rank must hold an equal share of the sequence (see torch_oss.distributed.shard)"
            )
        raise ValueError(
            f"torch_oss.distributed.{fn}: q, k, v shapes differ across ranks (q, k shapes and v head dim per rank: "
            f"{allv.tolist()})"
        )


# ---------------------------------------------------------------------------
# Block plan: which (query rows, key rows, causal) blocks of a step are computed
# ---------------------------------------------------------------------------


def _blocks(layout, is_causal, rank, src, L):
    """Blocks of this rank's queries against the K/V shard of rank `src`:
    a list of (q_start, q_len, k_start, k_len, causal). Causal blocks are on
    the diagonal (top-left: the same chunk of queries and keys); blocks with no
    visible key are left out."""
    if not is_causal:
        return [(0, L, 0, L, False)]
    if layout == "contiguous":
        if src < rank:
            return [(0, L, 0, L, False)]
        if src == rank:
            return [(0, L, 0, L, True)]
        return []
    c = L // 2
    if src == rank:
        # chunks (r, 2P-1-r) against themselves: top-left causal over the
        # concatenation is exact (chunk r never sees chunk 2P-1-r, which is later,
        # and chunk 2P-1-r sees all of chunk r)
        return [(0, L, 0, L, True)]
    if src < rank:
        # both query chunks come after key chunk src; key chunk 2P-1-src is after both
        return [(0, L, 0, c, False)]
    # src > rank: query chunk 2P-1-r comes after both key chunks; query chunk r before both
    return [(c, c, 0, L, False)]


_UNBOUNDED = 1 << 62


def _window_blocks(layout, rank, src, L, size, left, right):
    """_blocks under a window on the global positions: key j is visible from
    query i when i - left <= j <= i + right (-1: that side unbounded; causal
    attention is right = 0). One block per pair of a query chunk of this rank
    and a key chunk of rank `src`, cut down to the queries and keys that see
    some pair, as (q_start, q_len, k_start, k_len, causal, window): window is
    the (left, right) of the block's own top-left diagonal, or None where the
    block needs no window (every pair visible: causal False; the top-left
    causal triangle: causal True)."""
    lo = _UNBOUNDED if left < 0 else left
    hi = _UNBOUNDED if right < 0 else right
    q_chunks, _ = _chunks(layout, rank, size)
    k_chunks, _ = _chunks(layout, src, size)
    c = L // len(q_chunks)
    blocks = []
    for qi, gq in enumerate(ch * c for ch in q_chunks):
        for ki, gk in enumerate(ch * c for ch in k_chunks):
            # the keys some query of the chunk sees, the queries that see one
            # of them, and the keys those queries see (global positions)
            k0, k1 = max(gk, gq - lo), min(gk + c, gq + c + hi)
            q0, q1 = max(gq, k0 - hi), min(gq + c, k1 + lo)
            k0, k1 = max(gk, q0 - lo), min(gk + c, q1 + hi)
            if q0 >= q1 or k0 >= k1:
                continue
            # local d = i - j is the global one minus delta = q0 - k0, so the
            # window's sides shift by delta (both stay >= 0 by the cuts above)
            delta = q0 - k0
            bl = -1 if left < 0 else left - delta
            br = -1 if right < 0 else right + delta
            ql, kl = q1 - q0, k1 - k0
            all_rows = bl < 0 or bl >= ql - 1
            if all_rows and (br < 0 or br >= kl - 1):
                block = (False, None)
            elif all_rows and br == 0:
                block = (True, None)
            else:
                block = (False, (bl, br))
            blocks.append((qi * c + q0 - gq, ql, ki * c + k0 - gk, kl) + block)
    return blocks


def _plan(layout, is_causal, rank, src, L, size, window):
    """The blocks of one ring step as (q_start, q_len, k_start, k_len, causal,
    window): _blocks without a window (the fewest, largest calls), else
    _window_blocks (causal attention is the window's right side 0)."""
    if window == (-1, -1):
        return [b + (None,) for b in _blocks(layout, is_causal, rank, src, L)]
    left, right = window
    return _window_blocks(layout, rank, src, L, size, left, 0 if is_causal else right)


# ---------------------------------------------------------------------------
# Ring communication
# ---------------------------------------------------------------------------


class _Ring:
    """Sends to the next rank and receives from the previous one with
    dist.batch_isend_irecv. On CUDA tensors the ops are issued from a side
    stream that first waits for the compute stream (so what is sent is
    ready); wait() makes the compute stream wait for the transfer before the
    received buffer is used."""

    def __init__(self, group, rank, size, device):
        self.group = group
        self.size = size
        self.next = dist.get_global_rank(group, (rank + 1) % size)
        self.prev = dist.get_global_rank(group, (rank - 1) % size)
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def send_recv(self, send, tag=0):
        """Posts the send of `send` to the next rank and a receive of a tensor
        like it from the previous rank; returns (recv_buffer, handle). `tag`
        keeps the K/V and the dK/dV streams apart on backends that match
        messages by tag (gloo); NCCL matches them by issue order, the same on
        every rank."""
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        if self.stream is None:
            return recv, dist.batch_isend_irecv(ops)
        compute = torch.cuda.current_stream(send.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            reqs = dist.batch_isend_irecv(ops)
        # the caching allocator must not reuse these while the side stream uses them
        send.record_stream(self.stream)
        recv.record_stream(self.stream)
        return recv, reqs

    def wait(self, reqs):
        for req in reqs:
            req.wait()  # on CUDA: makes the current (compute) stream wait for the transfer
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)


def _pack(*tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _unpack(buf, like):
    out, off = [], 0
    for shape in like:
        n = math.prod(shape)
        out.append(buf[off:off + n].view(shape))
        off += n
    return out


# ---------------------------------------------------------------------------
# LSE merge
# ---------------------------------------------------------------------------


def _merge_(out_acc, lse_acc, out_i, lse_i):
    """out_acc, lse_acc (float32/64 views, updated in place) merged with a
    partial result (out_i, lse_i) by the log-sum-exp rule. Rows that have seen
    no key so far (lse -inf on both sides) stay 0 with lse -inf."""
    lse_i = lse_i.to(lse_acc.dtype)
    new = torch.logaddexp(lse_acc, lse_i)
    safe = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    w_acc = torch.exp(lse_acc - safe).unsqueeze(-1)
    w_i = torch.exp(lse_i - safe).unsqueeze(-1)
    out_acc.mul_(w_acc).add_(out_i.to(out_acc.dtype) * w_i)
    lse_acc.copy_(new)


def _acc_dtype(dtype):
    """Where partial results are merged and gradients accumulated: float32 for
    16-bit inputs, float64 for float32 and float64 inputs (a float32 merge
    would round the output that the backward's D = rowsum(dO * O) is taken
    from, which costs float32 gradients several times PyTorch's error)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else torch.float64


def _block_dtype(dtype):
    """The dtype each block is computed in: the input's, but float64 for
    float32 inputs (see _acc_dtype: a float32 block output is rounded once
    more before the merge)."""
    return torch.float64 if dtype == torch.float32 else dtype


# ---------------------------------------------------------------------------
# Block gradients
# ---------------------------------------------------------------------------


def _reads_lse(q):
    """Whether oss.attention_backward on these inputs takes the lse and out it
    is given (keys_subset=True: the CPU kernels and the float16/bfloat16 CUDA
    kernels), so that the merged lse and output give each block its exact
    share of the global gradient in one call. The float32/float64 CUDA (SIMT)
    kernels recompute the row statistics from the keys they see, which gives
    the block-local gradient instead."""
    return q.device.type == "cpu" or (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16))


def _cuda_half(q):
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def _block_backward(dout, q, k, v, out, lse, residual, d_global, causal, scale, enable_gqa, deterministic,
                    softcap=0.0, window=None):
    """(dq, dk, dv) of one block of keys: its share of the gradient of the
    global attention whose merged output and lse are `out` and `lse`, in the
    accumulation dtype.

    Kernels that take the lse (_reads_lse): one oss.attention_backward call
    with keys_subset and the merged out and lse (on CUDA in the inputs' dtype
    with the output's rounding residual; on the CPU all in float64).

    The others (the float32/float64 CUDA kernels) compute the block-local gradient, with P_b = softmax over the
    block's keys. The global share is, with w = exp(lse_b - lse) the block's
    weight in the merge, D_b = rowsum(dO * O_b) and D = rowsum(dO * O):
    dS = w P_b (dP - D) = [P_b (w dP - w D_b)] + g P_b, g = w (D_b - D).
    The bracket is the block-local backward with dO scaled by w; the rest is
    the gradient through the block's lse: dq += scale g (P_b K),
    dk += scale P_b^T (g Q). Both extra products ride on the calls that are
    made anyway, as extra value columns: the block forward (needed for O_b and
    lse_b) runs with values [V, K], which gives P_b K; the backward runs with
    values [V, 0] and dO [w dO, scale g Q], whose dV is [dV, P_b^T scale g Q]
    (zero value columns leave dP, and so dq and dk, unchanged). The split
    into two terms that partly cancel costs accuracy, so this path computes
    in the accumulation dtype (float64 for float32 inputs)."""
    acc = _acc_dtype(q.dtype)
    window = [-1, -1] if window is None else list(window)
    if _reads_lse(q):
        tensors, res = (dout, q, k, v, out, lse), residual
        if not q.is_cuda:  # the CPU: out is the merged output in the accumulation dtype; all in float64
            tensors, res = tuple(t.to(torch.float64) for t in tensors), None
        dq, dk, dv = torch.ops.oss.attention_backward(*tensors, None, causal, scale, enable_gqa, "top_left",
                                                      deterministic, res, window_size=window, softcap=softcap,
                                                      keys_subset=True)
        return dq.to(acc), dk.to(acc), dv.to(acc)
    sc = scale if scale is not None else q.shape[-1] ** -0.5
    qf, kf, vf, dof = (t.to(acc) for t in (q, k, v, dout))
    Dv = v.shape[-1]
    o_ext, lse_b = torch.ops.oss.attention(qf, kf, torch.cat([vf, kf], -1), None, causal, scale, enable_gqa,
                                           "top_left", window_size=window)
    out_b, pk = o_ext[..., :Dv], o_ext[..., Dv:]
    lse_g = lse.to(acc)
    w = torch.exp(lse_b - torch.where(torch.isneginf(lse_g), torch.zeros_like(lse_g), lse_g))
    g = w * ((dof * out_b).sum(-1) - d_global.to(acc))
    dout_ext = torch.cat([w.unsqueeze(-1) * dof, (sc * g).unsqueeze(-1) * qf], -1)
    zeros = torch.zeros_like(kf)
    dq, dk, dv_ext = torch.ops.oss.attention_backward(
        dout_ext, qf, kf, torch.cat([vf, zeros], -1), torch.cat([out_b, torch.zeros_like(pk)], -1), lse_b, None,
        causal, scale, enable_gqa, "top_left", deterministic, None, window_size=window)
    return (dq + (sc * g).unsqueeze(-1) * pk).to(acc), (dk + dv_ext[..., Dv:]).to(acc), dv_ext[..., :Dv].to(acc)


# ---------------------------------------------------------------------------
# Ring attention
# ---------------------------------------------------------------------------


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, sinks, group, rank, size, is_causal, scale, layout, enable_gqa, softcap, window):
        B, Hq, L, _ = q.shape
        Dv = v.shape[-1]
        acc = _acc_dtype(q.dtype)
        out_acc = torch.zeros(B, Hq, L, Dv, dtype=acc, device=q.device)
        lse_acc = torch.full((B, Hq, L), float("-inf"), dtype=acc, device=q.device)
        ring = _Ring(group, rank, size, q.device) if size > 1 else None
        shapes = (tuple(k.shape), tuple(v.shape))
        kv = _pack(k, v) if size > 1 else None
        k_cur, v_cur = k, v
        bdt = _block_dtype(q.dtype)
        half = q.dtype in (torch.float16, torch.bfloat16)
        qb = q.to(bdt)
        for step in range(size):
            src = (rank - step) % size
            pending = None
            if step + 1 < size:
                nxt, pending = ring.send_recv(kv)
            kb, vb = k_cur.to(bdt), v_cur.to(bdt)
            for qs, ql, ks, kl, causal, win in _plan(layout, is_causal, rank, src, L, size, window):
                args = (qb.narrow(2, qs, ql), kb.narrow(2, ks, kl), vb.narrow(2, ks, kl), None, causal, scale,
                        enable_gqa, "top_left")
                kw = dict(softcap=softcap, window_size=[-1, -1] if win is None else list(win))
                if half:
                    # the block output with its rounding residual: the merge
                    # sees it unrounded (to 1/32 of its last place)
                    o_i, lse_i, res_i = torch.ops.oss.attention_with_residual(*args, **kw)
                    o_i = o_i.to(acc) + output_residual_value(res_i, o_i).to(acc)
                else:
                    o_i, lse_i = torch.ops.oss.attention(*args, **kw)
                _merge_(out_acc.narrow(2, qs, ql), lse_acc.narrow(2, qs, ql), o_i, lse_i)
            if pending is not None:
                ring.wait(pending)
                kv = nxt
                k_cur, v_cur = _unpack(kv, shapes)
        if sinks is not None:
            # the sink joins every row's denominator once: one more partial
            # result with output 0 and lse = the sink
            sink_lse = sinks.detach().to(acc).reshape(1, Hq, 1).expand(B, Hq, L)
            _merge_(out_acc, lse_acc, torch.zeros((), dtype=acc, device=q.device).expand(B, Hq, L, Dv), sink_lse)
        out = out_acc.to(q.dtype)
        if _cuda_half(q):
            # the kernel takes D = rowsum(dO * (out + residual)): the merged
            # output without its final rounding (to 1/32 of its last place)
            residual = output_residual_code(out_acc, out)
            ctx.save_for_backward(q, k, v, out, lse_acc, residual, sinks)
        else:
            ctx.save_for_backward(q, k, v, out_acc, lse_acc, None, sinks)
        ctx.cfg = (group, rank, size, is_causal, scale, layout, enable_gqa, softcap, window)
        lse = lse_acc.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, residual, sinks = ctx.saved_tensors
        group, rank, size, is_causal, scale, layout, enable_gqa, softcap, window = ctx.cfg
        need_q, need_k, need_v, need_sinks = ctx.needs_input_grad[:4]
        if not (need_q or need_k or need_v or need_sinks):
            return (None,) * 13
        if grad_out is None:
            grad_out = torch.zeros(out.shape, dtype=q.dtype, device=q.device)
        grad_out = grad_out.to(q.dtype)
        deterministic = torch.are_deterministic_algorithms_enabled()
        # D = rowsum(dO * O) of the merged output (saved in the accumulation
        # dtype on this path), for kernels that compute the block-local
        # gradient (see _block_backward)
        d_global = None
        if not _reads_lse(q):
            d_global = (grad_out.to(out.dtype) * out).sum(-1)
        L = q.shape[2]
        acc = _acc_dtype(q.dtype)
        dsinks = None
        if need_sinks:
            # d sink_h = -sum over this rank's rows of p_sink D (the other ranks
            # hold the other rows: their shares add up where the gradients of
            # replicated parameters are reduced)
            merged = out.to(acc) + (output_residual_value(residual, out).to(acc) if residual is not None else 0)
            d_rows = (grad_out.to(acc) * merged).sum(-1)
            p_sink = torch.exp(sinks.detach().to(acc).reshape(1, -1, 1) - lse)
            dsinks = -(p_sink * d_rows).sum((0, 2))
        dq = torch.zeros(q.shape, dtype=acc, device=q.device) if need_q else None
        ring = _Ring(group, rank, size, q.device) if size > 1 else None
        shapes = (tuple(k.shape), tuple(v.shape))
        kv = _pack(k, v) if size > 1 else None
        k_cur, v_cur = k, v
        # the dK/dV accumulator of the K/V block this rank holds (float32/64),
        # received from the previous rank, which added its share before
        dkv_pending, dkv_in = None, None
        for step in range(size):
            src = (rank - step) % size
            kv_pending = None
            if step + 1 < size:
                kv_next, kv_pending = ring.send_recv(kv)
            dk_blk = torch.zeros(k.shape, dtype=acc, device=q.device)
            dv_blk = torch.zeros(v.shape, dtype=acc, device=q.device)
            for qs, ql, ks, kl, causal, win in _plan(layout, is_causal, rank, src, L, size, window):
                rows = slice(qs, qs + ql)
                dq_i, dk_i, dv_i = _block_backward(
                    grad_out[:, :, rows], q[:, :, rows], k_cur.narrow(2, ks, kl), v_cur.narrow(2, ks, kl),
                    out[:, :, rows], lse[:, :, rows], None if residual is None else residual[:, :, rows],
                    None if d_global is None else d_global[:, :, rows], causal, scale, enable_gqa, deterministic,
                    softcap, win)
                if dq is not None:
                    dq[:, :, rows] += dq_i
                dk_blk[:, :, ks:ks + kl] += dk_i
                dv_blk[:, :, ks:ks + kl] += dv_i
            if size == 1:
                dkv = (dk_blk, dv_blk)
                break
            if dkv_pending is not None:
                ring.wait(dkv_pending)
                dk_blk += dkv_in[0]
                dv_blk += dkv_in[1]
            buf, dkv_pending = ring.send_recv(_pack(dk_blk, dv_blk), tag=1)
            dkv_in = _unpack(buf, shapes)
            if kv_pending is not None:
                ring.wait(kv_pending)
                kv = kv_next
                k_cur, v_cur = _unpack(kv, shapes)
        if size > 1:
            ring.wait(dkv_pending)  # this rank's own dK/dV, back from its last stop
            dkv = dkv_in
        grads = (dq.to(q.dtype) if need_q else None,
                 dkv[0].to(k.dtype) if need_k else None,
                 dkv[1].to(v.dtype) if need_v else None,
                 dsinks.to(sinks.dtype) if need_sinks else None)
        return (*grads, None, None, None, None, None, None, None, None, None)


# ---------------------------------------------------------------------------
# All-gather variant
# ---------------------------------------------------------------------------


def _reduce_scatter_seq(full, group, size, dim):
    """Sum of `full` over the ranks, each rank keeping its own contiguous
    piece along dim (rank order). reduce_scatter where the backend has it,
    else all_reduce and narrow (gloo)."""
    full = full.contiguous()
    piece = full.shape[dim] // size
    parts = [p.contiguous() for p in full.split(piece, dim=dim)]
    if dist.get_backend(group) != "gloo":
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=group)
        return out
    dist.all_reduce(full, group=group)
    return full.narrow(dim, dist.get_rank(group) * piece, piece).contiguous()


class _AllGatherKV(torch.autograd.Function):
    """Every rank's K (or V) shard in global sequence order (in `dtype`, exact);
    the backward sums the gradient over the ranks in the accumulation dtype and
    gives each its shard's part, rounded once to the shard's dtype."""

    @staticmethod
    def forward(ctx, x, group, size, layout, dtype):
        ctx.cfg = (group, size, layout, x.dtype)
        parts = _all_gather_seq(x, group, size, 2)
        return _reorder_gathered(parts, layout, 2).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        group, size, layout, x_dtype = ctx.cfg
        g = grad.to(_acc_dtype(x_dtype))
        if layout == "zigzag":
            # back to rank order (rank r's shard is chunks r and 2P-1-r)
            n = 2 * size
            c = g.shape[2] // n
            g = torch.cat([g.narrow(2, i * c, c) for r in range(size) for i in (r, n - 1 - r)], dim=2)
        return _reduce_scatter_seq(g, group, size, 2).to(x_dtype), None, None, None, None


def _allgather_forward(q, k, v, group, rank, size, is_causal, scale, layout, enable_gqa, softcap=0.0, sinks=None,
                       window=(-1, -1)):
    from .functional import attention_with_lse

    if window != (-1, -1):
        return _allgather_window(q, k, v, group, rank, size, is_causal, scale, layout, enable_gqa, softcap, sinks,
                                 window)
    if not is_causal:
        k_all = _AllGatherKV.apply(k, group, size, layout, k.dtype)
        v_all = _AllGatherKV.apply(v, group, size, layout, v.dtype)
        return attention_with_lse(q, k_all, v_all, scale=scale, enable_gqa=enable_gqa, softcap=softcap, sinks=sinks)
    L = q.shape[2]
    chunks, _ = _chunks(layout, rank, size)
    c = L // len(chunks)
    # each chunk's call gives K and V a gradient: gathered in the accumulation
    # dtype (exactly), those are summed there, over the chunks and the ranks,
    # and rounded to K's dtype once, at the end of the backward
    k_all = _AllGatherKV.apply(k, group, size, layout, _acc_dtype(k.dtype))
    v_all = _AllGatherKV.apply(v, group, size, layout, _acc_dtype(v.dtype))
    outs, lses = [], []
    for j, chunk in enumerate(chunks):
        # queries of global chunk `chunk` see the keys up to the end of that chunk:
        # causal with the queries at the end of the keys (bottom-right)
        n_keys = (chunk + 1) * c
        o, lse = attention_with_lse(q.narrow(2, j * c, c), k_all.narrow(2, 0, n_keys).to(q.dtype),
                                    v_all.narrow(2, 0, n_keys).to(q.dtype), is_causal=True, scale=scale,
                                    enable_gqa=enable_gqa, causal_alignment="bottom_right", softcap=softcap,
                                    sinks=sinks)
        outs.append(o)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0]
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def _allgather_window(q, k, v, group, rank, size, is_causal, scale, layout, enable_gqa, softcap, sinks, window):
    """_allgather_forward under a window on the global positions (causal: its
    right side 0): one call per query chunk, on the gathered keys its window
    reaches, with the window shifted to that slice's top-left diagonal."""
    from .functional import attention_with_lse

    left, right = window[0], 0 if is_causal else window[1]
    L = q.shape[2]
    chunks, _ = _chunks(layout, rank, size)
    c = L // len(chunks)
    k_all = _AllGatherKV.apply(k, group, size, layout, _acc_dtype(k.dtype))
    v_all = _AllGatherKV.apply(v, group, size, layout, _acc_dtype(v.dtype))
    n = k_all.shape[2]
    outs, lses = [], []
    for j, chunk in enumerate(chunks):
        g0 = chunk * c  # the chunk's first query; it sees keys g0 - left .. g0 + c - 1 + right
        s0 = 0 if left < 0 else max(0, g0 - left)
        e0 = n if right < 0 else min(n, g0 + c + right)
        delta = g0 - s0  # global d = i - j is the slice's d plus delta
        ws = (-1 if left < 0 else left - delta, -1 if right < 0 else right + delta)
        o, lse = attention_with_lse(q.narrow(2, j * c, c), k_all.narrow(2, s0, e0 - s0).to(q.dtype),
                                    v_all.narrow(2, s0, e0 - s0).to(q.dtype), scale=scale, enable_gqa=enable_gqa,
                                    window_size=ws, softcap=softcap, sinks=sinks)
        outs.append(o)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0]
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def ring_attention(q, k, v, *, group=None, is_causal=False, scale=None, layout="zigzag", return_lse=False,
                   enable_gqa=False, comm="ring", check_shapes=True, window_size=(-1, -1), softcap=0.0, sinks=None):
    """Attention over a sequence sharded across the ranks of ``group``.

    q (B, Hq, L, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv): this rank's shard
    (``L`` = this rank's tokens, equal on every rank; :func:`shard` makes them).
    Returns this rank's rows of the attention of the global sequence,
    (B, Hq, L, Dv) in q's dtype, and with ``return_lse=True`` also their
    log-sum-exp, float32 (float64 for float64 inputs), shape (B, Hq, L), which
    carries no gradient.

    is_causal: causal over the *global* positions (top-left, as SDPA).
    scale: the softmax scale (default 1/sqrt(D)). enable_gqa: k and v may have
    fewer heads than q (Hq a multiple of Hkv), as in SDPA.
    layout: ``"zigzag"`` (rank r holds global chunks r and 2P-1-r of 2P; causal
    work balanced) or ``"contiguous"`` (rank r holds the r-th of P pieces).
    comm: ``"ring"`` (K/V blocks passed around the ring, overlapped with the
    computation) or ``"allgather"`` (K/V all-gathered once; dK/dV
    reduce-scattered in the backward).
    check_shapes: one small all_gather per call checks that every rank's shard
    has the same shape (unequal shards would hang or mis-merge); pass False to
    skip it once the shapes are known to agree.
    window_size, softcap, sinks: torch_oss.attention's score variants.
    window_size=(left, right) is on the global positions (key j is visible
    from query i when i - left <= j <= i + right; -1: unbounded; with
    is_causal, right is 0); the ring then computes, per step, only the parts
    of the blocks the window reaches. sinks (Hq,) are the same on every rank;
    their gradient here is this rank's rows' share, to be summed over the
    group as for any replicated parameter. softcap is not served on the ring
    for float32/float64 CUDA inputs.
    """
    fn = "ring_attention" if comm == "ring" else "allgather_attention"
    _check_inputs(q, k, v, fn, layout, comm, enable_gqa, scale, softcap, sinks)
    from .functional import _check_window

    window = _check_window(window_size, f"torch_oss.distributed.{fn}")
    group, rank, size = _check_group(group, fn)
    if check_shapes:
        _check_same_shapes(q, k, v, group, size, fn)
    if comm == "allgather":
        out, lse = _allgather_forward(q, k, v, group, rank, size, bool(is_causal), scale, layout, enable_gqa,
                                      float(softcap), sinks, window)
        lse = lse.detach()  # as on the ring: the returned lse carries no gradient
    else:
        out, lse = _RingAttention.apply(q, k, v, sinks, group, rank, size, bool(is_causal), scale, layout, enable_gqa,
                                        float(softcap), window)
    return (out, lse) if return_lse else out


def allgather_attention(q, k, v, *, group=None, is_causal=False, scale=None, layout="zigzag", return_lse=False,
                        enable_gqa=False, check_shapes=True, window_size=(-1, -1), softcap=0.0, sinks=None):
    """:func:`ring_attention` with ``comm="allgather"``: K/V of every rank
    all-gathered once, one local attention per query chunk, dK/dV
    reduce-scattered in the backward. For models whose K/V are small (grouped
    -query attention with few K/V heads): two collectives instead of P-1 ring
    steps, at the memory cost of the full sequence's K/V on every rank."""
    return ring_attention(q, k, v, group=group, is_causal=is_causal, scale=scale, layout=layout,
                          return_lse=return_lse, enable_gqa=enable_gqa, comm="allgather", check_shapes=check_shapes,
                          window_size=window_size, softcap=softcap, sinks=sinks)


# ---------------------------------------------------------------------------
# Hugging Face integration
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def ring_attention_context(group=None, layout="zigzag", comm="ring"):
    """Within the block, transformers models run with
    ``attn_implementation="oss"`` compute their attention as ring attention
    over ``group``: each rank feeds its shard of ``input_ids`` with the
    matching ``position_ids`` (see :func:`shard` and :func:`position_ids`)
    and gets its shard of the logits.

    Serves causal self-attention without padding (the mask builder then hands
    the attention no mask), with the layer's sliding window, softcap and sinks
    where it has them, and non-causal attention without a mask; a layer that
    receives an explicit mask (padding, a KV cache) raises, as its mask would
    describe only the local shard. Dropout must be 0. The "oss" implementation
    is restored on exit.
    """
    _check_layout(layout, "ring_attention_context")
    if comm not in COMMS:
        raise ValueError(f"torch_oss.distributed.ring_attention_context: comm={comm!r} must be one of {COMMS}")
    _check_group(group, "ring_attention_context")
    from transformers import AttentionInterface

    from . import transformers_integration as _hf

    _hf.register_transformers()

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if kwargs.get("position_bias") is not None:
            raise ValueError("ring_attention_context: `position_bias` is not supported by ring attention")
        sliding_window = kwargs.get("sliding_window")
        # FlashAttention's window for HF's sliding_window (keys i - sliding_window < j), on the global positions
        window_size = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, int(sliding_window) - 1)
        softcap = kwargs.get("softcap") or 0.0
        sinks = kwargs.get("s_aux")
        if sinks is None:
            sinks = kwargs.get("sinks")
        if attention_mask is not None:
            raise ValueError(
                "ring_attention_context: the layer received an attention mask (padding or a KV "
                "cache); ring attention serves unpadded full-sequence causal or non-causal attention only"
            )
        if dropout:
            raise ValueError("ring_attention_context: dropout > 0 is not supported (use model.eval() or dropout 0)")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        out = ring_attention(query, key, value, group=group, is_causal=bool(is_causal), scale=scaling,
                             layout=layout, enable_gqa=query.shape[1] != key.shape[1], comm=comm,
                             window_size=window_size, softcap=float(softcap), sinks=sinks)
        return out.transpose(1, 2).contiguous(), None

    def no_mask(*args, **kwargs):
        # The causal structure is that of the global sequence, which ring
        # attention applies itself; a mask built here would describe the local
        # shard (and transformers reads the zigzag position ids as packed
        # sequences). Padding masks are not served (see above).
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("ring_attention_context: padded batches (an attention_mask with zeros) are not "
                             "supported by ring attention")
        return None

    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # pragma: no cover - older transformers build the mask in the model
        AttentionMaskInterface = None
    AttentionInterface.register(_hf.NAME, forward)
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(_hf.NAME, no_mask)
    try:
        yield
    finally:
        AttentionInterface.register(_hf.NAME, _hf.attention_forward)
        if AttentionMaskInterface is not None:
            AttentionMaskInterface.register(_hf.NAME, _hf.mask)
