//! GGUF's block formats: dequantisation to f32 exactly as ggml's reference does it (32-weight
//! blocks, and the 256-weight super-blocks of the K-quants that Q4_K_M and friends are made
//! of), and quantisation into the formats our GGUF writer produces.
use half::{bf16, f16};

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q5_1: u32 = 7;
pub const Q8_0: u32 = 8;
pub const Q2_K: u32 = 10;
pub const Q3_K: u32 = 11;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub const BF16: u32 = 30;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// (weights per block, bytes per block) of a supported type.
pub fn block_layout(ty: u32) -> Option<(usize, usize)> {
    match ty {
        F32 => Some((1, 4)),
        F16 | BF16 => Some((1, 2)),
        Q4_0 => Some((32, 18)),
        Q4_1 => Some((32, 20)),
        Q5_0 => Some((32, 22)),
        Q5_1 => Some((32, 24)),
        Q8_0 => Some((32, 34)),
        Q2_K => Some((QK_K, 84)),
        Q3_K => Some((QK_K, 110)),
        Q4_K => Some((QK_K, 144)),
        Q5_K => Some((QK_K, 176)),
        Q6_K => Some((QK_K, 210)),
        _ => None,
    }
}

pub fn type_name(ty: u32) -> &'static str {
    match ty {
        F32 => "F32",
        F16 => "F16",
        Q4_0 => "Q4_0",
        Q4_1 => "Q4_1",
        Q5_0 => "Q5_0",
        Q5_1 => "Q5_1",
        Q8_0 => "Q8_0",
        Q2_K => "Q2_K",
        Q3_K => "Q3_K",
        Q4_K => "Q4_K",
        Q5_K => "Q5_K",
        Q6_K => "Q6_K",
        BF16 => "BF16",
        _ => "unsupported",
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises `n` weights from `bytes` (exactly the tensor's data) of type `ty`.
/// The caller has checked the type with `block_layout` and the byte length.
pub fn dequantize(ty: u32, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    let (_, block) = block_layout(ty).expect("checked by block_layout");
    match ty {
        F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        F16 => out.extend(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        BF16 => out.extend(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        _ => bytes.chunks_exact(block).for_each(|b| dequantize_block(ty, b, &mut out)),
    }
    out.truncate(n);
    out
}

/// One block of a quantised type, appended to `out`.
fn dequantize_block(ty: u32, b: &[u8], out: &mut Vec<f32>) {
    match ty {
        Q4_0 => {
            // f16 d, u8 qs[16]: w[j] = (lo nibble − 8) d, w[j+16] = (hi nibble − 8) d
            let (d, qs) = (f16_at(b, 0), &b[2..18]);
            out.extend(qs.iter().map(|q| ((q & 0xF) as f32 - 8.0) * d));
            out.extend(qs.iter().map(|q| ((q >> 4) as f32 - 8.0) * d));
        }
        Q4_1 => {
            // f16 d, f16 m, u8 qs[16]: w[j] = lo nibble · d + m, w[j+16] = hi nibble · d + m
            let (d, m, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..20]);
            out.extend(qs.iter().map(|q| (q & 0xF) as f32 * d + m));
            out.extend(qs.iter().map(|q| (q >> 4) as f32 * d + m));
        }
        Q5_0 | Q5_1 => {
            // f16 d, [f16 m,] u32 qh, u8 qs[16]: the fifth bit of weight j is bit j of qh.
            let (d, m, at) = if ty == Q5_0 { (f16_at(b, 0), 0.0, 2) } else { (f16_at(b, 0), f16_at(b, 2), 4) };
            let qh = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
            let qs = &b[at + 4..at + 20];
            let q = |j: usize, nibble: u8| (nibble as u32 | ((qh >> j) & 1) << 4) as f32;
            // Q5_0: (q − 16)·d; Q5_1: q·d + m (ggml's order of operations, so the bits agree).
            let w = |j: usize, nibble: u8| if ty == Q5_0 { (q(j, nibble) - 16.0) * d } else { q(j, nibble) * d + m };
            out.extend((0..16).map(|j| w(j, qs[j] & 0xF)));
            out.extend((0..16).map(|j| w(j + 16, qs[j] >> 4)));
        }
        Q8_0 => {
            // f16 d, i8 qs[32]: w[j] = qs[j] d
            let d = f16_at(b, 0);
            out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
        }
        Q2_K => {
            // u8 scales[16] (4-bit scale | 4-bit min), u8 qs[64] (2 bits each), f16 d, f16 dmin
            let (scales, qs, d, dmin) = (&b[0..16], &b[16..80], f16_at(b, 80), f16_at(b, 82));
            let mut is = 0;
            for half in 0..2 {
                let q = &qs[32 * half..32 * half + 32];
                for shift in [0, 2, 4, 6] {
                    for part in 0..2 {
                        let sc = scales[is];
                        is += 1;
                        let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                        out.extend(q[16 * part..16 * part + 16].iter().map(|&v| dl * ((v >> shift) & 3) as f32 - ml));
                    }
                }
            }
        }
        Q3_K => {
            // u8 hmask[32] (the third bit, inverted), u8 qs[64] (2 bits), 12 bytes of sixteen
            // 6-bit scales, f16 d
            let (hmask, qs, d) = (&b[0..32], &b[32..96], f16_at(b, 108));
            let scales = q3_k_scales(&b[96..108]);
            let (mut is, mut m) = (0, 1u8);
            for half in 0..2 {
                let q = &qs[32 * half..32 * half + 32];
                for shift in [0, 2, 4, 6] {
                    for part in 0..2 {
                        let dl = d * (scales[is] as i32 - 32) as f32;
                        is += 1;
                        let r = 16 * part..16 * part + 16;
                        out.extend(q[r.clone()].iter().zip(&hmask[r]).map(|(&v, &h)| dl * (((v >> shift) & 3) as i32 - if h & m != 0 { 0 } else { 4 }) as f32));
                    }
                    m <<= 1;
                }
            }
        }
        Q4_K | Q5_K => {
            // f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs, [u8 qh[32],] u8 qs[128]
            let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
            let (qh, qs) = if ty == Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for j in 0..4 {
                let q = &qs[32 * j..32 * j + 32];
                for (k, shift) in [(2 * j, 0), (2 * j + 1, 4)] {
                    let (sc, mn) = k_scale_min(k, scales);
                    let (dl, ml) = (d * sc as f32, dmin * mn as f32);
                    let high = |l: usize| qh.map_or(0, |h| ((h[l] >> k) & 1) << 4);
                    out.extend((0..32).map(|l| dl * (((q[l] >> shift) & 0xF) | high(l)) as f32 - ml));
                }
            }
        }
        Q6_K => {
            // u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), i8 scales[16], f16 d
            let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208));
            for half in 0..2 {
                let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
                let mut y = [0f32; 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q = |low: u8, shift: u8| ((low | ((qh[l] >> shift) & 3) << 4) as i32 - 32) as f32;
                    y[l] = d * (sc[is] as i8) as f32 * q(ql[l] & 0xF, 0);
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q(ql[l + 32] & 0xF, 2);
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q(ql[l] >> 4, 4);
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q(ql[l + 32] >> 4, 6);
                }
                out.extend(y);
            }
        }
        _ => unreachable!("checked by block_layout"),
    }
}

/// The `k`-th (scale, min) pair of a Q4_K/Q5_K block's 12 scale bytes: the first four pairs are
/// the low 6 bits of bytes 0–3 and 4–7, the last four take their low 4 bits from bytes 8–11
/// and their top 2 bits from the top bits of bytes 0–7.
fn k_scale_min(k: usize, s: &[u8]) -> (u8, u8) {
    if k < 4 {
        (s[k] & 63, s[k + 4] & 63)
    } else {
        ((s[k + 4] & 0xF) | ((s[k - 4] >> 6) << 4), (s[k + 4] >> 4) | ((s[k] >> 6) << 4))
    }
}

/// A Q3_K block's sixteen 6-bit scales (biased by 32) from its 12 bytes: the low 4 bits of
/// scales 0–7 and 8–15 are the nibbles of bytes 0–7, their top 2 bits the bit pairs of bytes
/// 8–11.
fn q3_k_scales(s: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = low | high << 4;
    }
    out
}

// ---- quantisation (the writer's formats) ----

/// Quantises `x` (a whole number of blocks of `ty`) into `ty`'s blocks. Supported: F32, F16,
/// Q4_1, Q8_0, Q5_0, Q5_1, Q4_K and Q6_K — what `gguf::quantize` writes.
pub fn quantize(ty: u32, x: &[f32]) -> Vec<u8> {
    match ty {
        F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        F16 => x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
        Q4_1 => x.chunks_exact(32).flat_map(quantize_q4_1).collect(),
        Q8_0 => x.chunks_exact(32).flat_map(quantize_q8_0).collect(),
        Q5_0 => x.chunks_exact(32).flat_map(quantize_q5_0).collect(),
        Q5_1 => x.chunks_exact(32).flat_map(quantize_q5_1).collect(),
        Q4_K => x.chunks_exact(QK_K).flat_map(quantize_q4_k).collect(),
        Q6_K => x.chunks_exact(QK_K).flat_map(quantize_q6_k).collect(),
        other => panic!("quantize: {} is not a type the writer produces", type_name(other)),
    }
}

/// The element of largest magnitude, with its sign.
fn signed_max(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
    b
}

/// A scale for codes in `lo..=hi` (lo < 0 < hi) that fits `x` in least squares: the codes of
/// a few trial scales (the largest magnitude at −lo·(1 − k/40) … or at hi), each followed by the
/// best scale for its codes, Σxq / Σq²; the trial with the least squared error wins. (ggml's
/// reference quantisers take the first trial only; this is ours, as llama.cpp's
/// make_qx_quants searches.)
fn fit_symmetric(x: &[f32], lo: i32, hi: i32) -> f32 {
    let m = signed_max(x);
    if m == 0.0 {
        return 0.0;
    }
    let trials = (0..8).map(|k| m / (lo as f32 * (1.0 - k as f32 / 40.0))).chain([m / hi as f32]);
    let mut best = (f32::INFINITY, 0.0);
    for s in trials {
        let q: Vec<i32> = x.iter().map(|v| (v / s).round().clamp(lo as f32, hi as f32) as i32).collect();
        let (xq, qq) = x.iter().zip(&q).fold((0f64, 0f64), |(a, b), (v, &q)| (a + (*v as f64) * q as f64, b + (q * q) as f64));
        let d = if qq > 0.0 { (xq / qq) as f32 } else { s };
        let err: f32 = x.iter().zip(&q).map(|(v, &q)| (v - d * q as f32).powi(2)).sum();
        if err < best.0 {
            best = (err, d);
        }
    }
    best.1
}

fn quantize_q5_0(x: &[f32]) -> Vec<u8> {
    let d = f16::from_f32(fit_symmetric(x, -16, 15)).to_f32();
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<u8> = x.iter().map(|v| ((v * id).round() as i32 + 16).clamp(0, 31) as u8).collect();
    let qh = (0..32).fold(0u32, |h, j| h | (((q[j] >> 4) & 1) as u32) << j);
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(qh.to_le_bytes());
    b.extend((0..16).map(|j| (q[j] & 0xF) | (q[j + 16] & 0xF) << 4));
    b
}

/// Q4_1 as ggml's reference quantiser: m = min x and d = (max − min) / 15 as half floats,
/// q = round((x − m) / d) in 0…15 (rounded with the stored m and d, so that q·d + m is the
/// nearest grid value ggml's dequantiser gives back).
fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let m = f16::from_f32(lo).to_f32();
    let d = f16::from_f32((hi - lo) / 15.0).to_f32();
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<u8> = x.iter().map(|v| ((v - m) * id).round().clamp(0.0, 15.0) as u8).collect();
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(f16::from_f32(m).to_le_bytes());
    b.extend((0..16).map(|j| q[j] | q[j + 16] << 4));
    b
}

/// Q5_1: x ≈ q·d + m with q in 0…31: the block's range in n steps for n = 31 down to 15, the
/// one with the least squared error (with d and m rounded to f16 as stored) kept. Weights that
/// were quantised before on a coarser grid of the same block (a Q4_1 file's) are found on it
/// again.
fn quantize_q5_1(x: &[f32]) -> Vec<u8> {
    let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let m = f16::from_f32(lo).to_f32();
    let mut best = (f32::INFINITY, 0.0, Vec::new());
    for steps in (15..=31).rev() {
        let d = f16::from_f32((hi - lo) / steps as f32).to_f32();
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<u8> = x.iter().map(|v| ((v - m) * id).round().clamp(0.0, 31.0) as u8).collect();
        let err: f32 = x.iter().zip(&q).map(|(v, &q)| (v - (q as f32 * d + m)).powi(2)).sum();
        if err < best.0 {
            best = (err, d, q);
        }
    }
    let (_, d, q) = best;
    let qh = (0..32).fold(0u32, |h, j| h | (((q[j] >> 4) & 1) as u32) << j);
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(f16::from_f32(m).to_le_bytes());
    b.extend(qh.to_le_bytes());
    b.extend((0..16).map(|j| (q[j] & 0xF) | (q[j + 16] & 0xF) << 4));
    b
}

/// Q4_K: eight sub-blocks of 32 with a scale and a min each (x ≈ q·scale − min, q in 0…15),
/// the scales and mins as 6-bit multiples of the block's f16 d and dmin.
fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        (scale[j], min[j]) = fit_affine(sub);
    }
    let d = scale.iter().fold(0f32, |m, &v| m.max(v)) / 63.0;
    let dmin = min.iter().fold(0f32, |m, &v| m.max(v)) / 63.0;
    let (d, dmin) = (f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32());
    let six = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let ls: Vec<u8> = scale.iter().map(|&s| six(s, d)).collect();
    let lm: Vec<u8> = min.iter().map(|&m| six(m, dmin)).collect();
    let mut scales = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (ls[j] & 0xF) | (lm[j] & 0xF) << 4;
            scales[j - 4] |= (ls[j] >> 4) << 6;
            scales[j] |= (lm[j] >> 4) << 6;
        }
    }
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (sc, mn) = (d * ls[i / 32] as f32, dmin * lm[i / 32] as f32);
            if sc > 0.0 { ((v + mn) / sc).round().clamp(0.0, 15.0) as u8 } else { 0 }
        })
        .collect();
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(f16::from_f32(dmin).to_le_bytes());
    b.extend(scales);
    for j in 0..4 {
        b.extend((0..32).map(|l| q[64 * j + l] | q[64 * j + 32 + l] << 4));
    }
    b
}

/// Scale and min for codes 0…15 (x ≈ q·scale − min, min ≥ 0 as Q4_K stores it): the codes of
/// the range [min(x, 0), max(x)], then the least-squares (scale, min) for those codes.
fn fit_affine(x: &[f32]) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |m, &v| m.min(v));
    let hi = x.iter().fold(lo, |m, &v| m.max(v));
    if hi == lo {
        return (0.0, -lo);
    }
    let step = (hi - lo) / 15.0;
    let q: Vec<f64> = x.iter().map(|v| ((v - lo) / step).round().clamp(0.0, 15.0) as f64).collect();
    let n = x.len() as f64;
    let (sq, sqq, sx, sxq) = x.iter().zip(&q).fold((0.0, 0.0, 0.0, 0.0), |(a, b, c, d), (&v, &q)| (a + q, b + q * q, c + v as f64, d + v as f64 * q));
    let det = n * sqq - sq * sq;
    if det <= 0.0 {
        return (step, -lo);
    }
    // x ≈ scale·q + offset in least squares; Q4_K keeps min = −offset ≥ 0.
    let scale = (n * sxq - sq * sx) / det;
    let offset = (sx - scale * sq) / n;
    if scale <= 0.0 || offset > 0.0 {
        return (step, -lo);
    }
    (scale as f32, -offset as f32)
}

/// Q6_K: sixteen sub-blocks of 16 with a signed 8-bit scale each (x ≈ d·scale·q, q in −32…31).
fn quantize_q6_k(x: &[f32]) -> Vec<u8> {
    let sub: Vec<f32> = x.chunks_exact(16).map(|s| fit_symmetric(s, -32, 31)).collect();
    let d = sub.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    let d = f16::from_f32(d).to_f32();
    let sc: Vec<i8> = sub.iter().map(|&s| if d > 0.0 { (s / d).round().clamp(-127.0, 127.0) as i8 } else { 0 }).collect();
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = d * sc[i / 16] as f32;
            let q = if s != 0.0 { (v / s).round().clamp(-32.0, 31.0) as i32 } else { 0 };
            (q + 32) as u8
        })
        .collect();
    let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
    for half in 0..2 {
        let q = &q[128 * half..];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            ql[64 * half + l] = (q1 & 0xF) | (q3 & 0xF) << 4;
            ql[64 * half + l + 32] = (q2 & 0xF) | (q4 & 0xF) << 4;
            qh[32 * half + l] = (q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6;
        }
    }
    let mut b = ql;
    b.extend(qh);
    b.extend(sc.iter().map(|&s| s as u8));
    b.extend(f16::from_f32(d).to_le_bytes());
    b
}
