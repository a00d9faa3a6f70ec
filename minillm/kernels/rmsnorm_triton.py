"""The Triton kernels of the fused RMSNorm (forward, one-pass backward, and the looped and two-kernel paths for wide
rows); minillm.kernels.rmsnorm launches them and holds the layout's reasoning. Defined only when triton imports:
minillm must import without it.

With RESIDUAL the forward kernels also add a residual first: h = x + r, stored (rounded to H's dtype, as torch's
add rounds), then y = rmsnorm(h); with RESIDUAL the backward kernels add the gradient dh that reaches h from
elsewhere to the norm's own, so DX is the gradient of x and of r alike. Without it R, H and DH are never read
(the launchers pass other tensors of the call in their place)."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # minillm must import without triton; require_fused() explains
    triton = None
    tl = None
    HAS_TRITON = False


if HAS_TRITON:

    @triton.jit
    def _gain(W, cols, mask, offset, dtype: tl.constexpr, LLAMA: tl.constexpr):
        """(w + offset) in fp32; rounded through x's dtype in llama mode."""
        gain = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + tl.cast(offset, tl.float32)
        if LLAMA:
            gain = gain.to(dtype).to(tl.float32)
        return gain

    @triton.jit
    def _out(x_hat, gain, dtype: tl.constexpr, LLAMA: tl.constexpr):
        """y in fp32 before the final cast to x's dtype."""
        if LLAMA:
            x_hat = x_hat.to(dtype).to(tl.float32)
        return x_hat * gain

    @triton.jit
    def _row_in(x_ptr, r_ptr, h_ptr, mask, STORE: tl.constexpr, RESIDUAL: tl.constexpr):
        """The row the norm reads, in fp32: x, or with RESIDUAL h = x + r rounded to H's dtype (stored when
        STORE)."""
        x = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
        if RESIDUAL:
            h = (x + tl.load(r_ptr, mask=mask, other=0.0).to(tl.float32)).to(h_ptr.dtype.element_ty)
            if STORE:
                tl.store(h_ptr, h, mask=mask)
            x = h.to(tl.float32)
        return x

    @triton.jit
    def _fwd_kernel(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, N, eps, offset,
                    LLAMA: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        """One row per program, the whole row in one masked block. The gain is loaded with the row, before the
        reduction, so its load overlaps the row's instead of waiting for the sum. Y and H share a layout."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = _row_in(X + row * stride_x + cols, R + row * stride_r + cols, H + row * stride_y + cols, mask,
                    True, RESIDUAL)  # (BLOCK,)
        gain = _gain(W, cols, mask, offset, Y.dtype.element_ty, LLAMA)  # (BLOCK,)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + tl.cast(eps, tl.float32))  # scalar
        tl.store(RSTD + row, rstd)
        y = _out(x * rstd, gain, Y.dtype.element_ty, LLAMA)
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _fwd_loop_kernel(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, N, eps, offset,
                         LLAMA: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        """One row per program for rows wider than one block: sum of squares, then scale, in chunks (the second
        pass adds the residual again rather than reading back H)."""
        row = tl.program_id(0).to(tl.int64)
        x_row, r_row, h_row = X + row * stride_x, R + row * stride_r, H + row * stride_y
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = _row_in(x_row + cols, r_row + cols, h_row + cols, cols < N, True, RESIDUAL)  # (BLOCK,)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + tl.cast(eps, tl.float32))
        tl.store(RSTD + row, rstd)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = _row_in(x_row + cols, r_row + cols, h_row + cols, mask, False, RESIDUAL)
            gain = _gain(W, cols, mask, offset, Y.dtype.element_ty, LLAMA)
            y = _out(x * rstd, gain, Y.dtype.element_ty, LLAMA)
            tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _bwd_kernel(DY, DH, X, W, RSTD, DX, PARTIAL, stride_dy, stride_dh, stride_x, stride_dx, M, N, offset,
                    LLAMA: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                    STAGES: tl.constexpr):
        """One pass: program p takes row blocks p, p + P, p + 2P, ... (ROWS rows each) of a grid of P programs,
        writes dx = rstd * (g - x_hat * mean(g * x_hat)) (+ dh), g = dy * gain, and PARTIAL[p] = sum of
        dy * x_hat. The dW partial is one [BLOCK] row of fp32 registers whatever ROWS is: each block of rows is
        summed into it as it goes, so more rows in flight cost registers for their x and dy only."""
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        col_mask = cols < N
        gain = _gain(W, cols, col_mask, offset, X.dtype.element_ty, LLAMA)  # (BLOCK,)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r0 in tl.range(pid * ROWS, M, tl.num_programs(0) * ROWS, num_stages=STAGES):
            rows = (r0 + tl.arange(0, ROWS)).to(tl.int64)  # (ROWS,)
            row_mask = rows < M
            mask = row_mask[:, None] & col_mask[None, :]  # (ROWS, BLOCK)
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)[:, None]  # (ROWS, 1)
            x_hat = x * rstd
            g = dy * gain[None, :]
            c = tl.sum(g * x_hat, axis=1)[:, None] / N  # (ROWS, 1)
            dx = (g - x_hat * c) * rstd
            if RESIDUAL:
                dx += tl.load(DH + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            acc += tl.sum(dy * _out(x_hat, 1.0, X.dtype.element_ty, LLAMA), axis=0)  # (BLOCK,)
        # every program writes its row, zeros when it had no rows: the buffer can come from torch.empty
        tl.store(PARTIAL + pid.to(tl.int64) * N + cols, acc, mask=col_mask)

    @triton.jit
    def _bwd_dx_kernel(DY, DH, X, W, RSTD, DX, stride_dy, stride_dh, stride_x, stride_dx, N, offset,
                       LLAMA: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        """Wide rows: dx = rstd * (g - x_hat * mean(g * x_hat)) (+ dh), g = dy * gain; one row per program."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        g = dy * _gain(W, cols, mask, offset, X.dtype.element_ty, LLAMA)
        c = tl.sum(g * x_hat, axis=0) / N  # scalar
        dx = (g - x_hat * c) * rstd
        if RESIDUAL:
            dx += tl.load(DH + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)

    @triton.jit
    def _bwd_dx_loop_kernel(DY, DH, X, W, RSTD, DX, stride_dy, stride_dh, stride_x, stride_dx, N, offset,
                            LLAMA: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        """dx for rows wider than one block: mean(g * x_hat), then dx, in chunks."""
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * stride_x
        dy_row = DY + row * stride_dy
        rstd = tl.load(RSTD + row)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
            acc += dy * _gain(W, cols, mask, offset, X.dtype.element_ty, LLAMA) * (x * rstd)
        c = tl.sum(acc, axis=0) / N
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
            g = dy * _gain(W, cols, mask, offset, X.dtype.element_ty, LLAMA)
            dx = (g - x * rstd * c) * rstd
            if RESIDUAL:
                dx += tl.load(DH + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)

    @triton.jit
    def _bwd_dw_kernel(DY, X, RSTD, PARTIAL, stride_dy, stride_x, M, N, rows_per_program,
                       LLAMA: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
        """Wide rows: program (p, c) writes PARTIAL[p, tile c] = sum over the rows of group p of dy * x_hat."""
        group = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)  # (BLOCK_COLS,)
        col_mask = cols < N
        row_start = group * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, M)
        acc = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=tl.float32)
        for r0 in range(row_start, row_end, BLOCK_ROWS):
            rows = r0 + tl.arange(0, BLOCK_ROWS)  # (BLOCK_ROWS,)
            row_mask = rows < row_end
            rows64 = rows.to(tl.int64)
            mask = row_mask[:, None] & col_mask[None, :]  # (BLOCK_ROWS, BLOCK_COLS)
            x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
            dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
            rstd = tl.load(RSTD + rows64, mask=row_mask, other=0.0)  # (BLOCK_ROWS,)
            x_hat = _out(x.to(tl.float32) * rstd[:, None], 1.0, X.dtype.element_ty, LLAMA)
            acc += dy.to(tl.float32) * x_hat
        # every program writes its tile, zeros when its group is empty: the buffer can come from torch.empty
        tl.store(PARTIAL + group.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=col_mask)
