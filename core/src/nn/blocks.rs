//! A matrix's values as ggml's 4- and 8-bit blocks, found again. The teacher ships as a GGUF
//! file of Q4_1 matrices and a Q8_0 embedding; loading dequantises them to f32. Every value is
//! then exactly q·d + m (or q·d) for a block's half floats d and m and small integers q, and
//! q·d is exact in f32 (at most 8 + 11 significant bits), so the shaders can hold the blocks
//! and compute the same f32 values from them: the same products, bit for bit, at 5 or 9 bits
//! per weight instead of 32. A block is accepted only when all its 32 values come back to the
//! bit; a matrix whose values do not (a trained student's) is not packed.
//!
//! GPU layout, blocks of 32 consecutive values of a row (rows hold a whole number of blocks):
//! - Q4_1, 5 words: pack2x16float(d, m), then the 16 bytes of codes, byte j holding value j in
//!   its low nibble and value j + 16 in its high one (ggml's order);
//! - Q8_0, 9 words: d's f32 bits, then the 32 codes as signed bytes in order.
use crate::gpu::Dtype;
use half::f16;

/// Values per block.
pub const BLOCK: usize = 32;

/// `values` ([rows, cols], cols a multiple of 32) as the GPU words of `dtype`'s blocks, or
/// None where some block does not reproduce its 32 values exactly.
pub fn pack(dtype: Dtype, values: &[f32]) -> Option<Vec<u32>> {
    if values.len() % BLOCK != 0 {
        return None;
    }
    let mut words = Vec::with_capacity(values.len() / BLOCK * 9);
    for block in values.chunks_exact(BLOCK) {
        match dtype {
            Dtype::Q4_1 => words.extend(q4_1_block(block.try_into().expect("32 values"))?),
            Dtype::Q8_0 => words.extend(q8_0_block(block.try_into().expect("32 values"))?),
            Dtype::F32 | Dtype::F16 => return None,
        }
    }
    Some(words)
}

/// `values` rounded to ggml's Q4_1 grid as its reference quantiser rounds them (per block of
/// 32, m = min x and d = (max − min) / 15 as half floats, each value q·d + m with q in 0…15),
/// as the words the shaders read: ggml's 20 bytes of a block are those 5 words. None where a
/// value or a block's d or m is not finite. What `--weights q4_1` holds for projections (lossy).
pub fn quantize_q4_1(values: &[f32]) -> Option<Vec<u32>> {
    use crate::model::quant;
    if values.len() % BLOCK != 0 || !values.iter().all(|v| v.is_finite()) {
        return None;
    }
    let bytes = quant::quantize(quant::Q4_1, values);
    let words: Vec<u32> = bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    unpack(Dtype::Q4_1, &words).iter().all(|v| v.is_finite()).then_some(words)
}

/// The values `quantize_q4_1` holds (the f64 model's matrices in tests).
pub fn round_q4_1(values: &[f32]) -> Vec<f32> {
    use crate::model::quant;
    quant::dequantize(quant::Q4_1, &quant::quantize(quant::Q4_1, values), values.len())
}

/// `values` rounded to ggml's Q8_0 grid as its quantiser (and our GGUF writer) rounds them:
/// per block of 32, d = max |x| / 127 as a half float, each value q·d with q = round(x / d).
/// What `--weights q8_0` holds (lossy, unlike `gguf`).
pub fn round_q8_0(values: &[f32]) -> Vec<f32> {
    use crate::model::quant;
    quant::dequantize(quant::Q8_0, &quant::quantize(quant::Q8_0, values), values.len())
}

/// The values `pack` packed (the shaders' arithmetic, for tests and the host's checks).
pub fn unpack(dtype: Dtype, words: &[u32]) -> Vec<f32> {
    let per = match dtype {
        Dtype::Q4_1 => 5,
        Dtype::Q8_0 => 9,
        Dtype::F32 | Dtype::F16 => panic!("unpack: {} is not a block format", dtype.name()),
    };
    let mut out = Vec::with_capacity(words.len() / per * BLOCK);
    for b in words.chunks_exact(per) {
        match dtype {
            Dtype::Q4_1 => {
                let (d, m) = (half_of(b[0], 0), half_of(b[0], 16));
                out.extend((0..BLOCK).map(|j| q4_1_value(q4_code(&b[1..], j), d, m)));
            }
            _ => {
                let d = f32::from_bits(b[0]);
                out.extend((0..BLOCK).map(|j| q8_code(&b[1..], j) as f32 * d));
            }
        }
    }
    out
}

fn half_of(word: u32, shift: u32) -> f32 {
    f16::from_bits((word >> shift) as u16).to_f32()
}

/// Code j of a Q4_1 block's four code words: byte j % 16's low (j < 16) or high nibble.
fn q4_code(codes: &[u32], j: usize) -> u32 {
    let byte = codes[j % 16 / 4] >> (8 * (j % 4));
    (byte >> if j < 16 { 0 } else { 4 }) & 0xF
}

fn q8_code(codes: &[u32], j: usize) -> i32 {
    (codes[j / 4] >> (8 * (j % 4))) as u8 as i8 as i32
}

/// q·d + m in f32: the product is exact, so fused or not the sum rounds once, as the shaders'.
fn q4_1_value(q: u32, d: f32, m: f32) -> f32 {
    q as f32 * d + m
}

/// Candidate scales for a span reached by codes up to `top`: span/q rounded to a half float
/// and its two neighbours, for q = top down to 1 (the block's largest code need not be top).
fn scales(span: f32, top: u32) -> impl Iterator<Item = f32> {
    (1..=top).rev().flat_map(move |q| {
        let h = f16::from_f32(span / q as f32);
        let bits = h.to_bits();
        [h, f16::from_bits(bits.wrapping_add(1)), f16::from_bits(bits.wrapping_sub(1))]
    })
    .map(f16::to_f32)
    .filter(|d| d.is_finite() && *d > 0.0)
}

fn q4_1_block(x: &[f32; BLOCK]) -> Option<[u32; 5]> {
    let lo = x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    if !lo.is_finite() || !hi.is_finite() {
        return None;
    }
    let codes_for = |d: f32, m: f32| -> Option<[u32; BLOCK]> {
        let mut q = [0u32; BLOCK];
        for (qj, &v) in q.iter_mut().zip(x) {
            let c = if d > 0.0 { ((v - m) / d).round() } else { 0.0 };
            if !(0.0..=15.0).contains(&c) || q4_1_value(c as u32, d, m).to_bits() != v.to_bits() {
                return None;
            }
            *qj = c as u32;
        }
        Some(q)
    };
    let found = if hi == lo {
        Some(f16::from_f32(lo)).filter(|m| m.to_f32() == lo).and_then(|m| codes_for(0.0, m.to_f32()).map(|q| (0.0, m.to_f32(), q)))
    } else {
        // ggml's quantiser gives the smallest value code 0 (m = lo); others may start higher,
        // with m below the block's values.
        (0..15u32).find_map(|q_lo| {
            scales(hi - lo, 15 - q_lo).find_map(|d| {
                let m = f16::from_f32(lo - q_lo as f32 * d);
                let near = [m, f16::from_bits(m.to_bits().wrapping_add(1)), f16::from_bits(m.to_bits().wrapping_sub(1))];
                near.into_iter().map(f16::to_f32).filter(|m| m.is_finite()).find_map(|m| codes_for(d, m).map(|q| (d, m, q)))
            })
        })
    };
    let (d, m, q) = found?;
    let mut words = [0u32; 5];
    words[0] = f16::from_f32(d).to_bits() as u32 | (f16::from_f32(m).to_bits() as u32) << 16;
    for j in 0..16 {
        words[1 + j / 4] |= (q[j] | q[j + 16] << 4) << (8 * (j % 4));
    }
    Some(words)
}

fn q8_0_block(x: &[f32; BLOCK]) -> Option<[u32; 9]> {
    let top = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    if !top.is_finite() {
        return None;
    }
    let codes_for = |d: f32| -> Option<[i32; BLOCK]> {
        let mut q = [0i32; BLOCK];
        for (qj, &v) in q.iter_mut().zip(x) {
            let c = if d > 0.0 { (v / d).round() } else { 0.0 };
            if !(-128.0..=127.0).contains(&c) || (c as i32 as f32 * d).to_bits() != v.to_bits() {
                return None;
            }
            *qj = c as i32;
        }
        Some(q)
    };
    let found = if top == 0.0 { codes_for(0.0).map(|q| (0.0, q)) } else { scales(top, 128).find_map(|d| codes_for(d).map(|q| (d, q))) };
    let (d, q) = found?;
    let mut words = [0u32; 9];
    words[0] = d.to_bits();
    for (j, c) in q.iter().enumerate() {
        words[1 + j / 4] |= (*c as u8 as u32) << (8 * (j % 4));
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant;

    #[test]
    fn q4_1_rounding_is_ggmls_grid_and_the_words_hold_it() {
        let mut rng = crate::util::Rng::new(7);
        let mut x: Vec<f32> = (0..32 * 40).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32 * 0.1).collect();
        x[..32].fill(0.25); // a constant block: d = 0
        x[32..64].iter_mut().enumerate().for_each(|(j, v)| *v = j as f32 * 1e-3 - 3.0); // far from 0
        let words = quantize_q4_1(&x).expect("finite values");
        let held = unpack(Dtype::Q4_1, &words);
        assert_eq!(held.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), round_q4_1(&x).iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        for (block, got) in x.chunks_exact(BLOCK).zip(held.chunks_exact(BLOCK)) {
            let (lo, hi) = block.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            // Each value within half a step (plus the half floats' rounding of d and m) of its own.
            let step = (hi - lo) / 15.0;
            for (v, h) in block.iter().zip(got) {
                assert!((v - h).abs() <= 0.5 * step * 1.01 + 2e-3 * lo.abs().max(hi.abs()), "{v} held as {h} (step {step})");
            }
        }
        assert!(quantize_q4_1(&[f32::NAN; 32]).is_none());
        assert!(quantize_q4_1(&[1e6; 32].iter().enumerate().map(|(j, v)| if j == 0 { -v } else { *v }).collect::<Vec<_>>()).is_none(), "a range past half floats");
    }

    /// Blocks of ggml's formats with random codes and scales, dequantised by the GGUF loader.
    fn ggml_blocks(ty: u32, n_blocks: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::util::Rng::new(seed);
        let mut bytes = Vec::new();
        for _ in 0..n_blocks {
            let d = f16::from_f32((rng.next_f64() * 0.05) as f32 + 1e-4);
            let m = f16::from_f32((rng.next_f64() * 0.2 - 0.1) as f32);
            bytes.extend(d.to_le_bytes());
            if ty == quant::Q4_1 {
                bytes.extend(m.to_le_bytes());
                bytes.extend((0..16).map(|_| (rng.next_f64() * 256.0) as u8));
            } else {
                bytes.extend((0..32).map(|_| ((rng.next_f64() * 255.0) as i32 - 127) as i8 as u8));
            }
        }
        quant::dequantize(ty, &bytes, n_blocks * BLOCK)
    }

    #[test]
    fn ggml_blocks_are_found_again_to_the_bit() {
        for (ty, dtype) in [(quant::Q4_1, Dtype::Q4_1), (quant::Q8_0, Dtype::Q8_0)] {
            let x = ggml_blocks(ty, 500, 7);
            let words = pack(dtype, &x).unwrap_or_else(|| panic!("{} blocks not found", dtype.name()));
            let back = unpack(dtype, &words);
            assert!(x.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", dtype.name());
        }
    }

    #[test]
    fn values_off_the_grid_are_not_packed() {
        let mut x = ggml_blocks(quant::Q4_1, 3, 9);
        x[40] = f32::from_bits(x[40].to_bits() + 1);
        assert!(pack(Dtype::Q4_1, &x).is_none());
        let smooth: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        assert!(pack(Dtype::Q4_1, &smooth).is_none() && pack(Dtype::Q8_0, &smooth).is_none());
        assert!(pack(Dtype::Q8_0, &[f32::NAN; 32]).is_none());
        // Constant blocks and zeros come back (d = 0).
        let flat = [0.25f32; 32];
        assert_eq!(unpack(Dtype::Q4_1, &pack(Dtype::Q4_1, &flat).unwrap()), flat.to_vec());
        assert_eq!(unpack(Dtype::Q8_0, &pack(Dtype::Q8_0, &[0.0; 32]).unwrap()), vec![0.0; 32]);
    }
}
