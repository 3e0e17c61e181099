/* linear.h: a model's frozen linears with the network's adapters, run by the core (in
 * libgh200core_ops). A model keeps one ghc_linears_t, hands it the hook it gets in set_hook,
 * and calls ghc_linear_forward / ghc_linear_backward for every linear (with or without an
 * adapter target): the core asks the hook's plan once per target and carries it out for
 * every model alike, choosing among the ways the plan allows the one measured fastest:
 *   1. fold (plan.fold, the user's choice): delta-W folded into a copy of the weight;
 *   2. K-concatenation (plan.concat_rank = r fits the linear's spare room): one GEMM over
 *      [x | H] and [W | B] forward, [g | dH] and [W ; A] backward (no pass of the adapter's
 *      own over y or dx);
 *   3. the adapter's part written first where it can (plan.forward_writes/backward_writes),
 *      the GEMM adding its product to it (one read-modify-write pass fewer than 4);
 *   4. the GEMM, then the adapter's part added.
 * Weights stored as e4m3 are dequantised into a scratch the object owns, or multiplied as e4m3
 * where the model asks (struct ghc_linear.x_e4m3). */
#ifndef GHC_LINEAR_H
#define GHC_LINEAR_H

#include <gh200core/model.h>   /* defines: struct ghc_adapter_hook, ghc_core_t */
#include <gh200core/tensor.h>  /* defines: ghc_tensor_t, enum ghc_dtype */

GHC_BEGIN_DECLS

typedef struct ghc_linears ghc_linears_t;

/* One frozen linear y = x W^T + b as the model stores it, for one call. */
struct ghc_linear {
    int32_t             target;     /* the adapter target, or -1 (none: the GEMM alone) */
    const ghc_tensor_t *w;          /* [out, in]; with spare room [out + spare, ld]: the linear is
                                     * its first out rows and in columns */
    float               w_scale;    /* an e4m3 w's dequantisation scale; 1 otherwise */
    const ghc_tensor_t *b;          /* [out] or NULL */
    int64_t             out, in;    /* the linear's own shape */
    int64_t             spare_col;  /* K-concatenation: the first of the target's spare columns in w
                                     * and in xp (>= in). The concatenated GEMM runs over columns
                                     * [0, spare_col + r) of both (r: the rank), so w must be zero
                                     * over [in, spare_col) (another target's room) and xp finite
                                     * there: zero xp's spare columns once, when it is made. That is
                                     * how two targets share one input: xp = [x | the first's spare |
                                     * the second's spare], the second's spare_col after the first's
                                     * room and its w zero over the first's columns (each target's H
                                     * stays in its own columns until its backward) */
    int64_t             spare;      /* spare columns from spare_col, and spare rows after out (w
                                     * must have them); below the target's rank r (0: none) the
                                     * call takes the other ways */
    ghc_tensor_t       *x_e4m3;     /* NULL, or with an e4m3 w a scratch like x in e4m3: the forward
                                     * GEMM takes x cast to e4m3 (scale 1, saturating) times w
                                     * instead of the dequantised w */
};

/* For n_targets adapter targets of a model computing on `device` with GEMM operand dtype
 * `base` (bf16 or f32); max_weight: the most elements of any weight given (the size of the
 * scratch for dequantisation and folding, allocated when first needed with role
 * GHC_ROLE_WORKSPACE). NULL on error (message set). */
GHC_API ghc_linears_t *ghc_linears_new(ghc_core_t *core, int device, enum ghc_dtype base, int32_t n_targets,
                                       int64_t max_weight);
/* NULL is a no-op. */
GHC_API void ghc_linears_free(ghc_linears_t *l);
/* Install the hook (NULL: none) and ask its plan of every target. room: the spare columns (and
 * rows) each target's linear keeps ([n_targets]; NULL: none). This decides which targets
 * K-concatenate: those whose plan's rank r fits their room (and does not fold); each call on
 * such a target then concatenates where it gives xp (and gp, backward) and a spare >= r, and
 * takes the other ways where it gives no xp (or no gp) or spare 0. Returns the number of targets that K-concatenate
 * (>= 0), or GHC_E*. */
GHC_API int ghc_linears_set_hook(ghc_linears_t *l, const struct ghc_adapter_hook *hook, const int64_t *room);
/* The rank target concatenates with (0: none), and the rank of the plan, which may exceed the
 * room (*wanted may be NULL): a model tells its user how much room would take it. */
GHC_API int32_t ghc_linears_concat_rank(const ghc_linears_t *l, int32_t target, int32_t *wanted);
/* Whether target has an adapter in the installed hook's plan (a model may skip work that only
 * an adapter needs, e.g. an input gradient of a constant). */
GHC_API bool ghc_linears_adapted(const ghc_linears_t *l, int32_t target);
/* Whether the forwards until the next call are the recomputation (gradient checkpointing, right
 * before the backward) of forwards of this step. */
GHC_API void ghc_linears_recompute(ghc_linears_t *l, bool again);

/* y (f32, [B, rows, out]) = x W^T + b and the adapter's part. x: [B, rows, in] in the operand
 * dtype; xp: x with the spare columns after it (x a column view of xp; its columns past in
 * finite, see struct ghc_linear.spare_col), or NULL (no K-concatenation in this call).
 * (since API 19) y may be bf16: where the call K-concatenates, folds (or the target has no
 * adapter) one product writes all of it, rounded once; (since API 20) else the product and the
 * adapter's part go into an f32 scratch like y, rounded once into y. (since API 20) Where one
 * product writes a bf16 y, an f32 bias is rounded to bf16 first (as PyTorch's bf16 modules hold
 * it), so the GEMM adds it in its own epilogue; an f32 y takes the bias as given. */
GHC_API int ghc_linear_forward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *y,
                               const ghc_tensor_t *x, ghc_tensor_t *xp, void *stream);
/* (since API 20) A linear and a GELU after it, the transformer FFN's first half: pre = x W^T + b
 * and the adapter's part, exactly as ghc_linear_forward writes y (the same calls of the hook),
 * and g = gelu_tanh(pre). g and pre: one shape, both f32 or both bf16; pre dense, g dense or a
 * column view (e.g. the next linear's input with its spare columns). Where one product
 * writes all of pre (the call K-concatenates, folds, or the target has no adapter; with a bias;
 * not with x_e4m3; not where the adapter wrote its part first) g comes from that GEMM's epilogue,
 * the GELU of the unrounded sum (GHC_EPI_BIAS_GELU with pre_gelu = pre); otherwise
 * ghc_op_gelu_tanh(g, pre) after it. */
GHC_API int ghc_linear_forward_gelu(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *g,
                                    ghc_tensor_t *pre, const ghc_tensor_t *x, ghc_tensor_t *xp, void *stream);
/* Write again what the forward of `lin` left in xp's spare columns (K-concatenation's H), as a
 * recomputation of that forward (the hook's concat_forward with again): for a model whose xp is
 * shared by several linears' forwards (Wan's text context, one for every block), before the
 * backward of a linear whose forward is not recomputed right before it. 0 where the target
 * does not concatenate. */
GHC_API int ghc_linear_restore(ghc_linears_t *l, const struct ghc_linear *lin, const ghc_tensor_t *x,
                               ghc_tensor_t *xp, void *stream);
/* dx (f32, [B, rows, in]) = dy W (accumulate: +=) and the adapter's part, and the adapter's
 * parameter gradients. dx NULL: no input gradient (the adapter's gradients only). x and xp as
 * in the forward (xp holding the forward's H); dy f32. (since API 19) dx may be bf16: where the
 * call K-concatenates one product writes it, rounded once; else the product writes it and the
 * adapter's part is added in bf16 (rounded twice; unlike y, no f32 scratch: a caller with a
 * small-rank adapter that does not K-concatenate passes an f32 dx, as wan22 does).
 * cast: a scratch like dy in the operand dtype, for dy cast to it where the GEMM operand is not
 *   f32: with dx, where the weight the dx GEMM takes is not f32 (a bf16 w, or an e4m3 or folded
 *   w in a scratch of dtype base bf16); without dx, where base is bf16. Otherwise (base f32 and
 *   f32 or e4m3 weights) it is not written and may be NULL. Any scratch: it need not be a view
 *   of gp.
 * gp: with K-concatenation, a scratch like dy in the operand dtype with at least r columns
 *   after its out ([B, rows, >= out + r]: g, then dH); NULL: no K-concatenation in this call. */
GHC_API int ghc_linear_backward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *dx,
                                const ghc_tensor_t *x, ghc_tensor_t *xp, const ghc_tensor_t *dy, ghc_tensor_t *cast,
                                ghc_tensor_t *gp, bool accumulate, void *stream);

/* For tests and benchmarks (process-wide): the ways ghc_linear_* may take, GHC_LINEAR_ALL by
 * default; a way left out falls to the next that the plan allows. Read by ghc_linears_set_hook. */
enum {
    GHC_LINEAR_FOLD   = 1u << 0,
    GHC_LINEAR_CONCAT = 1u << 1,
    GHC_LINEAR_WRITE  = 1u << 2,
    GHC_LINEAR_ALL    = 7u
};
GHC_API void ghc_linear_ways(unsigned ways);

GHC_END_DECLS

#endif /* GHC_LINEAR_H */
