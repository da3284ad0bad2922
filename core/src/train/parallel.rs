//! Data parallelism as the distiller sees it: its rank among the processes of one run and the
//! collectives it calls. Every rank takes its own slice of each step's batch, the gradients are
//! averaged over the ranks before one identical optimizer step, and rank 0 alone writes. The
//! transport lives outside the core: the command line's MPI (feature `mpi`), or `Solo` — one
//! process, as every run without mpirun is.
use crate::error::{Error, Result};

/// The processes of one data-parallel run.
pub trait Collective {
    /// This process's rank, 0 ..size.
    fn rank(&self) -> usize;
    /// How many processes the run has.
    fn size(&self) -> usize;
    /// Replaces `values` by their sum over the ranks (every rank passes the same length).
    fn sum_f32(&self, values: &mut [f32]) -> Result<()>;
    /// `sum_f32` for f64 (losses).
    fn sum_f64(&self, values: &mut [f64]) -> Result<()>;
    /// Returns when every rank has called it.
    fn barrier(&self) -> Result<()>;
}

/// A run of one process: rank 0 of 1, every collective the identity.
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn sum_f32(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn sum_f64(&self, _: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// Rows first .. first + count of `batch` rows that rank `rank` of `size` takes: equal slices
/// in rank order, so the ranks together see the global batch of one process.
pub fn rank_rows(batch: usize, rank: usize, size: usize) -> Result<(usize, usize)> {
    if size == 0 || rank >= size {
        return Err(Error::argument("ranks", format!("rank {rank} of {size}")));
    }
    if batch % size != 0 {
        return Err(Error::argument("--batch", format!("{batch} sequences do not split evenly over {size} processes; give a batch that is a multiple of {size}")));
    }
    let per = batch / size;
    Ok((rank * per, per))
}

/// The mean over the ranks of equal-length gradients, in place: the sum, then one scale.
pub fn mean_f32(c: &dyn Collective, values: &mut [f32]) -> Result<()> {
    if c.size() == 1 {
        return Ok(());
    }
    c.sum_f32(values)?;
    let inv = 1.0 / c.size() as f32;
    values.iter_mut().for_each(|v| *v *= inv);
    Ok(())
}

/// `mean_f32` for f64.
pub fn mean_f64(c: &dyn Collective, values: &mut [f64]) -> Result<()> {
    if c.size() == 1 {
        return Ok(());
    }
    c.sum_f64(values)?;
    let inv = 1.0 / c.size() as f64;
    values.iter_mut().for_each(|v| *v *= inv);
    Ok(())
}
