//! Work splitting: rayon's global pool natively, the calling thread on wasm32 (see the module docs of
//! [`crate::cpu`]). Every kernel splits its output into disjoint chunks, so results do not depend on
//! the number of threads.

/// Threads the kernels split work over.
pub fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    {
        rayon::current_num_threads()
    }
    #[cfg(target_arch = "wasm32")]
    {
        1
    }
}

/// Items per task for `items` items of which a task should hold at least `min`: about four tasks per
/// thread (load balance), never fewer than `min` items each.
pub fn task_len(items: usize, min: usize) -> usize {
    items.div_ceil(4 * threads()).max(min).max(1)
}

/// `f(i, chunk)` for the `chunk`-element pieces of `out` (the last may be shorter), in parallel
/// natively.
pub fn chunks_mut<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    let chunk = chunk.max(1);
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
    #[cfg(target_arch = "wasm32")]
    out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
}

/// `[f(0), .., f(n - 1)]`, computed in parallel natively.
pub fn map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        (0..n).into_par_iter().map(f).collect()
    }
    #[cfg(target_arch = "wasm32")]
    {
        (0..n).map(f).collect()
    }
}
