//! The ranks of a data-parallel `distill`: MPI's world when mpirun started several processes
//! (built with the `mpi` feature), else one process. Each rank picks its own adapter by its
//! local rank — the GPUs of one machine report the same name — unless LINEARIZE_ADAPTER says.
use anyhow::{bail, Result};
use linearize_core::gpu::{Gpu, ADAPTER_INDEX_VAR};
use linearize_core::train::parallel::{Collective, Solo};

/// How many processes the launcher started, and this one's rank on its host, from the
/// variables Open MPI, MPICH and PMIx set (None: not started by a launcher).
fn launched() -> Option<(usize, usize)> {
    let get = |names: &[&str]| names.iter().find_map(|n| std::env::var(n).ok()?.trim().parse::<usize>().ok());
    let size = get(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"])?;
    let local = get(&["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"]).unwrap_or(0);
    Some((size, local))
}

/// `line` and a newline to stderr in one write: the ranks share the launcher's stderr, and
/// `eprintln!` writes each formatted piece on its own (stderr is unbuffered), so two ranks'
/// lines could interleave mid-line.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// This process's ranks, and the GPU it runs on.
pub fn start() -> Result<(Box<dyn Collective>, Gpu)> {
    let ranks: Box<dyn Collective> = match launched() {
        Some((size, local)) if size > 1 => {
            if std::env::var(ADAPTER_INDEX_VAR).is_err() {
                // One adapter per process on its host; where there are fewer adapters than
                // processes (a CPU adapter, a test) they take turns on them.
                let adapters = Gpu::adapters_blocking().len().max(1);
                if local >= adapters {
                    say(&format!("rank on host {local}: {adapters} adapter(s) for more processes; sharing adapter {}", local % adapters));
                }
                std::env::set_var(ADAPTER_INDEX_VAR, (local % adapters).to_string());
            }
            world(size)?
        }
        _ => Box::new(Solo),
    };
    let gpu = Gpu::new_blocking()?;
    Ok((ranks, gpu))
}

#[cfg(feature = "mpi")]
fn world(size: usize) -> Result<Box<dyn Collective>> {
    let w = mpi_ranks::Mpi::init()?;
    if w.size() != size {
        bail!("MPI reports {} processes where the launcher's environment says {size}", w.size());
    }
    Ok(Box::new(w))
}

#[cfg(not(feature = "mpi"))]
fn world(size: usize) -> Result<Box<dyn Collective>> {
    bail!("started as one of {size} MPI processes, but this linearize was built without MPI: build it with `cargo build --release -p linearize --features mpi` (Open MPI's libopenmpi-dev and libclang-dev installed), or run one process without mpirun")
}

#[cfg(feature = "mpi")]
mod mpi_ranks {
    use linearize_core::train::parallel::Collective;
    use linearize_core::Result;
    use mpi::collective::SystemOperation;
    use mpi::traits::*;

    /// MPI_COMM_WORLD; MPI is finalised when this is dropped (the end of the run).
    pub struct Mpi {
        _universe: mpi::environment::Universe,
        world: mpi::topology::SimpleCommunicator,
    }

    impl Mpi {
        pub fn init() -> anyhow::Result<Self> {
            let universe = mpi::initialize().ok_or_else(|| anyhow::anyhow!("MPI was initialised twice"))?;
            let world = universe.world();
            Ok(Mpi { _universe: universe, world })
        }
    }

    // MPI's default error handler aborts every rank on a failed call, so these return only on
    // success; a rank that dies takes the job down through mpirun.
    impl Collective for Mpi {
        fn rank(&self) -> usize {
            self.world.rank() as usize
        }
        fn size(&self) -> usize {
            self.world.size() as usize
        }
        fn sum_f32(&self, values: &mut [f32]) -> Result<()> {
            let send = values.to_vec();
            self.world.all_reduce_into(&send[..], values, SystemOperation::sum());
            Ok(())
        }
        fn sum_f64(&self, values: &mut [f64]) -> Result<()> {
            let send = values.to_vec();
            self.world.all_reduce_into(&send[..], values, SystemOperation::sum());
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            self.world.barrier();
            Ok(())
        }
    }
}
