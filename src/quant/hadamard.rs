//! The optional KV rotation (`--kv-rotate`): an orthonormal Walsh–Hadamard transform over
//! `head_dim`, applied to K and Q (so q·k is unchanged) and to V (undone after attention) before
//! quantization. It spreads K's outlier channels over all channels, which makes per-token and
//! per-head scales far less wasteful.
//!
//! `H = H_d / sqrt(d)` with `H_d` the Sylvester Hadamard matrix (`H_1 = [1]`,
//! `H_2n = [[H_n, H_n], [H_n, -H_n]]`, so `H_d[i][j] = (-1)^popcount(i & j)`). `H` is symmetric
//! and orthonormal, hence its own inverse: applying [`fwht_inplace`] twice gives the input back
//! (up to f32 rounding). Only powers of two have a Sylvester matrix; other `head_dim`s are
//! refused by [`check_rotation_dim`].

use super::kv::KvQuantError;

/// Accepts `head_dim` for rotation if it is a power of two; otherwise the error names the fix.
pub fn check_rotation_dim(head_dim: usize) -> Result<(), KvQuantError> {
    if head_dim.is_power_of_two() {
        Ok(())
    } else {
        Err(KvQuantError::RotateNeedsPowerOfTwo { head_dim })
    }
}

/// Multiplies `x` by `H` in place: the fast Walsh–Hadamard butterfly, O(d log d), then a scale.
///
/// Order of f32 operations (a WGSL mirror that repeats it gets the same bits): for
/// `h = 1, 2, 4, … d/2`, for every `j` with `j & h == 0`: `(x[j], x[j+h]) = (x[j] + x[j+h],
/// x[j] - x[j+h])`; finally every element is multiplied by `scale = 1 / sqrt(d)` computed as
/// `(d as f32).sqrt().recip()` (exact for `d = 4^k`; a GPU should receive it from the host
/// rather than call `inverseSqrt`, which WGSL lets be off by 2 ULP).
///
/// Panics (caller bug) if `x.len()` is not a power of two; user input is checked earlier by
/// [`check_rotation_dim`].
#[track_caller]
pub fn fwht_inplace(x: &mut [f32]) {
    let d = x.len();
    assert!(d.is_power_of_two(), "fwht_inplace needs a power-of-two length, got {d}");
    let mut h = 1;
    while h < d {
        for block in x.chunks_exact_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                (*a, *b) = (*a + *b, *a - *b);
            }
        }
        h *= 2;
    }
    let scale = (d as f32).sqrt().recip();
    x.iter_mut().for_each(|v| *v *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `H` as a dense row-major `[d, d]` matrix, built column by column with the butterfly.
    fn matrix(d: usize) -> Vec<f64> {
        let mut h = vec![0.0; d * d];
        for col in 0..d {
            let mut e = vec![0.0f32; d];
            e[col] = 1.0;
            fwht_inplace(&mut e);
            for (row, v) in e.iter().enumerate() {
                h[row * d + col] = f64::from(*v);
            }
        }
        h
    }

    #[test]
    fn butterfly_is_the_sylvester_matrix_and_orthonormal() {
        for d in [1, 2, 4, 8, 64, 128] {
            let h = matrix(d);
            let inv_sqrt = 1.0 / (d as f64).sqrt();
            for i in 0..d {
                for j in 0..d {
                    let sylvester = if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 };
                    assert!((h[i * d + j] - sylvester * inv_sqrt).abs() < 1e-7, "d {d} ({i},{j})");
                    // (H Hᵀ)[i][j]
                    let dot: f64 = (0..d).map(|k| h[i * d + k] * h[j * d + k]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-6, "d {d}: (H Hᵀ)[{i}][{j}] = {dot}");
                }
            }
        }
    }

    #[test]
    fn twice_is_identity_and_dot_products_survive() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for d in [8, 64, 128, 256] {
            let q: Vec<f32> = (0..d).map(|_| rng.random_range(-4.0..4.0)).collect();
            let mut k: Vec<f32> = (0..d).map(|_| rng.random_range(-4.0..4.0)).collect();
            k[3] = 90.0; // an outlier channel
            let dot = |a: &[f32], b: &[f32]| -> f64 {
                a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum()
            };
            let (mut qr, mut kr) = (q.clone(), k.clone());
            fwht_inplace(&mut qr);
            fwht_inplace(&mut kr);
            let (before, after) = (dot(&q, &k), dot(&qr, &kr));
            assert!((before - after).abs() <= 1e-5 * before.abs().max(1.0), "d {d}");
            // The outlier is spread: no rotated channel keeps even half of it.
            let max_rotated = kr.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(max_rotated < 45.0, "d {d}: {max_rotated}");
            fwht_inplace(&mut kr);
            for (i, (a, b)) in k.iter().zip(&kr).enumerate() {
                assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "d {d} index {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn refuses_non_powers_of_two() {
        assert!(check_rotation_dim(64).is_ok());
        assert!(check_rotation_dim(128).is_ok());
        let err = check_rotation_dim(80).unwrap_err();
        assert_eq!(err, KvQuantError::RotateNeedsPowerOfTwo { head_dim: 80 });
        assert!(err.to_string().contains("drop --kv-rotate"), "{err}");
    }
}
