//! Learning-rate schedules of the distillation stages (MIXERS.md §5), as a multiplier of the
//! peak rate at step s of n (0-based).
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// Warmup–stable–decay: linear warmup over `warmup`, flat, then linear decay over `decay`
    /// to `min_ratio` (stages 1 and 2: 10 % / 80 % / 10 %, 1e-4).
    Wsd { warmup: f64, decay: f64, min_ratio: f64 },
    /// Linear warmup, then linear decay to 0 (stage 3: 10 % warmup).
    Linear { warmup: f64 },
    /// Linear warmup, then cosine decay to `floor`.
    Cosine { warmup: f64, floor: f64 },
    /// Linear warmup, then constant (stage 2 in the paper's code: a fifth of the steps).
    Constant { warmup: f64 },
}

impl Schedule {
    pub fn paper_wsd() -> Self {
        Schedule::Wsd { warmup: 0.1, decay: 0.1, min_ratio: 1e-4 }
    }

    pub fn paper_linear() -> Self {
        Schedule::Linear { warmup: 0.1 }
    }

    /// Stage 2 of the paper's code: warmup over the first fifth of the steps, then the peak rate.
    pub fn paper_constant() -> Self {
        Schedule::Constant { warmup: 0.2 }
    }

    /// The multiplier at step `s` of `n`; warmup reaches 1 at its last step.
    pub fn factor(&self, s: usize, n: usize) -> f64 {
        let n = n.max(1) as f64;
        let t = s as f64;
        let warm = |w: f64| (w * n).round().max(0.0);
        match *self {
            Schedule::Wsd { warmup, decay, min_ratio } => {
                let (w, d) = (warm(warmup), (decay * n).round());
                if t < w {
                    (t + 1.0) / w
                } else if t < n - d {
                    1.0
                } else {
                    let x = (t - (n - d) + 1.0) / d.max(1.0);
                    1.0 - (1.0 - min_ratio) * x.min(1.0)
                }
            }
            Schedule::Linear { warmup } => {
                let w = warm(warmup);
                if t < w {
                    (t + 1.0) / w
                } else {
                    ((n - t) / (n - w).max(1.0)).clamp(0.0, 1.0)
                }
            }
            Schedule::Constant { warmup } => {
                let w = warm(warmup);
                if t < w {
                    (t + 1.0) / w
                } else {
                    1.0
                }
            }
            Schedule::Cosine { warmup, floor } => {
                let w = warm(warmup);
                if t < w {
                    (t + 1.0) / w
                } else {
                    let x = ((t - w) / (n - w).max(1.0)).min(1.0);
                    floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * x).cos())
                }
            }
        }
    }
}
