//! A model's weight matrices on the GPU, as the inference path holds them: f32, packed f16
//! pairs (half the memory, read with WGSL's `unpack2x16float`), or the 4- and 8-bit blocks of
//! the GGUF file they came from (nn::blocks: the same values at 5 or 9 bits each), split by
//! rows into parts that each fit one storage binding — a vocabulary-sized embedding can exceed
//! the 128 MiB that WebGPU and lavapipe bind by default. The two ops that read such a matrix sit
//! beside it: `project` (y = x·Wᵀ, each part filling its block of columns) and `embed` (row
//! lookup, each part serving the ids in its rows).
use super::{blocks, fuses_input, gather_part, linear_block, matvec_input, Columns, Gemm, LinearInput, LinearKernel};
use crate::error::{Error, Result};
use crate::gpu::{Dtype, Gpu, GpuBuf, Recorder};

/// How the inference commands are asked to hold a model's projection and embedding matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    /// Packed f16 pairs: half the memory, logits within a few hundredths of f32's.
    F16,
    /// Each matrix in the smallest of the GGUF blocks (Q4_1, then Q8_0) that gives back every
    /// one of its values exactly, f32 where none does: the f32 model's products, bit for bit, in
    /// a sixth of the memory for the teacher (its file's Q4_1 matrices and Q8_0 embedding).
    Gguf,
    /// Every matrix rounded to ggml's Q8_0 blocks at load (nn::blocks::round_q8_0), 9 words per
    /// 32 values: lossy, for models whose matrices lie on no grid (a trained student's).
    Q8_0,
    /// Every projection rounded to ggml's Q4_1 blocks at load (nn::blocks::round_q4_1), 5 words
    /// per 32 values, and the embedding (the tied head) to Q8_0, as llama.cpp's Q4_1 files
    /// keep it: lossy, the smallest a trained student gets.
    Q4_1,
}

impl WeightFormat {
    /// "f32", "f16" or "gguf": how the command line and the web API name it.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::Gguf => "gguf",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4_1 => "q4_1",
        }
    }

    /// How a student's mixer matrices are held: f32 or packed f16 (decode's stacked mixer
    /// product, with its convs, reads no blocks; trained values lie on no grid anyway).
    pub fn mixer_dtype(self) -> Dtype {
        match self {
            WeightFormat::F16 => Dtype::F16,
            WeightFormat::F32 | WeightFormat::Gguf | WeightFormat::Q8_0 | WeightFormat::Q4_1 => Dtype::F32,
        }
    }

    /// How the embedding (and an untied head) is held: as asked, but Q8_0 where the
    /// projections go to 4 bits (one row per token read, and the head's logits are what the
    /// model outputs).
    pub fn for_embedding(self) -> WeightFormat {
        match self {
            WeightFormat::Q4_1 => WeightFormat::Q8_0,
            other => other,
        }
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [WeightFormat::F32, WeightFormat::F16, WeightFormat::Gguf, WeightFormat::Q8_0, WeightFormat::Q4_1]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| Error::argument("weights", format!("'{s}' is not one of 'f32', 'f16', 'gguf', 'q8_0', 'q4_1'")))
    }
}

/// How a matrix of rows of `cols` values is held when `want` is asked for: packed f16 only
/// where cols is divisible by 4 (the linear kernels read four halves at a time), f32 otherwise.
pub fn matrix_dtype(want: Dtype, cols: usize) -> Dtype {
    if cols % 4 == 0 {
        want
    } else {
        Dtype::F32
    }
}

/// The matrix `data` ([rows, cols]) as `format` holds it: its dtype, and the block words where
/// it is held in blocks (rows of whole blocks, every value found again).
fn held(format: WeightFormat, data: &[f32], cols: usize) -> (Dtype, Option<Vec<u32>>) {
    if data.is_empty() {
        return (matrix_dtype(format.mixer_dtype(), cols), None);
    }
    match format {
        WeightFormat::F32 => (Dtype::F32, None),
        WeightFormat::F16 => (matrix_dtype(Dtype::F16, cols), None),
        WeightFormat::Gguf if cols % blocks::BLOCK == 0 => [Dtype::Q4_1, Dtype::Q8_0]
            .into_iter()
            .find_map(|dtype| blocks::pack(dtype, data).map(|words| (dtype, Some(words))))
            .unwrap_or((Dtype::F32, None)),
        WeightFormat::Q8_0 if cols % blocks::BLOCK == 0 => match blocks::pack(Dtype::Q8_0, &blocks::round_q8_0(data)) {
            Some(words) => (Dtype::Q8_0, Some(words)),
            None => (Dtype::F32, None), // non-finite values: no grid holds them
        },
        WeightFormat::Q4_1 if cols % blocks::BLOCK == 0 => match blocks::quantize_q4_1(data) {
            Some(words) => (Dtype::Q4_1, Some(words)),
            None => (Dtype::F32, None), // non-finite values, or a range past half floats
        },
        WeightFormat::Gguf | WeightFormat::Q8_0 | WeightFormat::Q4_1 => (Dtype::F32, None),
    }
}

/// A row-major [rows, cols] matrix in parts of whole rows.
#[derive(Debug)]
pub struct Weight {
    pub rows: usize,
    pub cols: usize,
    pub dtype: Dtype,
    /// (first row, buffer of the rows from there), in row order.
    parts: Vec<(usize, GpuBuf)>,
}

impl Weight {
    /// Uploads `data` ([rows, cols]) as `format` holds it, split so that no part exceeds what
    /// one binding (and one buffer) of this device holds.
    pub fn upload(gpu: &Gpu, label: &str, data: &[f32], rows: usize, cols: usize, format: WeightFormat) -> Result<Self> {
        if data.len() != rows * cols {
            return Err(Error::Gpu(format!("{label}: {} values for a [{rows}, {cols}] matrix", data.len())));
        }
        let (dtype, words) = held(format, data, cols);
        let row_bytes = dtype.bytes(cols);
        let limit = (gpu.limits.max_storage_buffer_binding_size as u64).min(gpu.limits.max_buffer_size);
        let per_part = (limit / row_bytes.max(1)) as usize;
        if per_part == 0 {
            return Err(Error::Gpu(format!("{label}: one row of {cols} values exceeds this device's binding limit of {limit} bytes")));
        }
        let mut parts = Vec::new();
        for row0 in (0..rows.max(1)).step_by(per_part) {
            let slice = &data[row0 * cols..((row0 + per_part).min(rows)) * cols];
            let name = if rows > per_part { format!("{label} rows {row0}..") } else { label.to_string() };
            let buf = match dtype {
                // The tensor-core GEMM keeps its f16 copy of an f32 weight (nn::coop).
                Dtype::F32 => {
                    let mut buf = gpu.upload_f32(&name, slice)?;
                    buf.keep_copies();
                    buf
                }
                Dtype::F16 => gpu.upload_f16(&name, slice)?,
                Dtype::Q4_1 | Dtype::Q8_0 => {
                    let words = words.as_deref().expect("a matrix held in blocks has its words");
                    let per_row = words.len() / rows;
                    gpu.upload_blocks(&name, &words[row0 * per_row..row0 * per_row + slice.len() / cols * per_row], slice.len(), dtype)?
                }
            };
            parts.push((row0, buf));
        }
        Ok(Weight { rows, cols, dtype, parts })
    }

    /// The matrix as one f32 buffer, for the training passes (gradients and AdamW work on
    /// whole f32 tensors).
    pub fn whole(&self) -> Result<&GpuBuf> {
        match self.parts.as_slice() {
            [(_, buf)] if self.dtype == Dtype::F32 => Ok(buf),
            _ => Err(Error::Gpu(format!(
                "training needs each weight as one f32 buffer; this [{}, {}] weight is {} in {} part(s)",
                self.rows,
                self.cols,
                self.dtype.describe(),
                self.parts.len()
            ))),
        }
    }

    /// `whole`, mutable: the optimizer moves the buffer into its flat segments.
    pub fn whole_mut(&mut self) -> Result<&mut GpuBuf> {
        self.whole()?;
        Ok(&mut self.parts[0].1)
    }

    /// How many buffers hold the matrix.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Device memory the matrix takes.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b.bytes()).sum()
    }

    fn rows_of(&self, i: usize) -> usize {
        self.parts.get(i + 1).map_or(self.rows, |p| p.0) - self.parts[i].0
    }
}

/// y[m, rows] (+)= x[m, cols] · Wᵀ.
pub fn project(rec: &mut Recorder, x: &GpuBuf, w: &Weight, y: &GpuBuf, m: usize, accumulate: bool) -> Result<()> {
    for (i, (row0, part)) in w.parts.iter().enumerate() {
        linear_block(rec, LinearKernel::Auto, x, part, Columns { y, ldy: w.rows, y0: *row0 }, Gemm { m, n: w.rows_of(i), k: w.cols }, accumulate)?;
    }
    Ok(())
}

/// y[m, rows] (+)= x'[m, cols] · Wᵀ with x' = `input`: decode's products on GPUs compute the
/// input's norm or SwiGLU as they load it; elsewhere that op runs first, into a temporary.
pub fn project_input(rec: &mut Recorder, input: LinearInput, w: &Weight, y: &GpuBuf, m: usize, accumulate: bool) -> Result<()> {
    if !fuses_input(rec, m, w.rows, w.cols) {
        let x = input.materialize(rec, m, w.cols)?;
        return project(rec, &x, w, y, m, accumulate);
    }
    for (i, (row0, part)) in w.parts.iter().enumerate() {
        matvec_input(rec, input, part, Columns { y, ldy: w.rows, y0: *row0 }, Gemm { m, n: w.rows_of(i), k: w.cols }, accumulate)?;
    }
    Ok(())
}

/// out[r, :] = W[ids[r], :] for `rows` ids (checked against W's rows by the caller).
pub fn embed(rec: &mut Recorder, ids: &GpuBuf, w: &Weight, out: &GpuBuf, rows: usize) -> Result<()> {
    for (i, (row0, part)) in w.parts.iter().enumerate() {
        gather_part(rec, ids, part, out, rows, w.cols, (*row0, w.rows_of(i)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::WeightFormat;

    #[test]
    fn weight_formats_parse_by_name_and_refuse_others_by_name() {
        for f in [WeightFormat::F32, WeightFormat::F16, WeightFormat::Gguf, WeightFormat::Q8_0, WeightFormat::Q4_1] {
            assert_eq!(f.name().parse::<WeightFormat>().unwrap(), f);
        }
        let err = "q4".parse::<WeightFormat>().unwrap_err().to_string();
        assert!(err.contains("weights") && err.contains("'q4'") && err.contains("gguf"), "{err}");
    }
}
