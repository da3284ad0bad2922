//! Dequantisation of GGUF tensor blocks to f32 (ggml's formats, 32 weights per block).
use half::{bf16, f16};

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;
pub const BF16: u32 = 30;

/// (weights per block, bytes per block) of a supported type.
pub fn block_layout(ty: u32) -> Option<(usize, usize)> {
    match ty {
        F32 => Some((1, 4)),
        F16 | BF16 => Some((1, 2)),
        Q4_0 => Some((32, 18)),
        Q4_1 => Some((32, 20)),
        Q8_0 => Some((32, 34)),
        _ => None,
    }
}

pub fn type_name(ty: u32) -> &'static str {
    match ty {
        F32 => "F32",
        F16 => "F16",
        Q4_0 => "Q4_0",
        Q4_1 => "Q4_1",
        Q8_0 => "Q8_0",
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
    match ty {
        F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        F16 => out.extend(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        BF16 => out.extend(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        Q4_0 => {
            // f16 d, u8 qs[16]: w[j] = (lo nibble - 8) d, w[j+16] = (hi nibble - 8) d
            for blk in bytes.chunks_exact(18) {
                let d = f16_at(blk, 0);
                let qs = &blk[2..18];
                out.extend(qs.iter().map(|q| ((q & 0xF) as f32 - 8.0) * d));
                out.extend(qs.iter().map(|q| ((q >> 4) as f32 - 8.0) * d));
            }
        }
        Q4_1 => {
            // f16 d, f16 m, u8 qs[16]: w[j] = lo nibble · d + m, w[j+16] = hi nibble · d + m
            for blk in bytes.chunks_exact(20) {
                let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                let qs = &blk[4..20];
                out.extend(qs.iter().map(|q| (q & 0xF) as f32 * d + m));
                out.extend(qs.iter().map(|q| (q >> 4) as f32 * d + m));
            }
        }
        Q8_0 => {
            // f16 d, i8 qs[32]: w[j] = qs[j] d
            for blk in bytes.chunks_exact(34) {
                let d = f16_at(blk, 0);
                out.extend(blk[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        _ => unreachable!("checked by block_layout"),
    }
    out.truncate(n);
    out
}
