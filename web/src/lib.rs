//! linearize in the browser: the core crate's kernels on WebGPU through wasm-bindgen.
//! Everything is async; nothing blocks on readback.
use linearize_core::gpu::Gpu;
use linearize_core::nn;
use wasm_bindgen::prelude::*;

fn js_err(e: impl std::fmt::Display) -> JsValue {
    JsValue::from_str(&e.to_string())
}

/// A WebGPU device with linearize's kernels.
#[wasm_bindgen]
pub struct WebGpu {
    gpu: Gpu,
}

#[wasm_bindgen]
impl WebGpu {
    /// Requests an adapter and a device; rejects with a readable message without WebGPU.
    pub async fn create() -> Result<WebGpu, JsValue> {
        let gpu = Gpu::new().await.map_err(js_err)?;
        Ok(WebGpu { gpu })
    }

    /// The adapter as JSON (name, backend, limits).
    pub fn adapter_json(&self) -> String {
        serde_json_string(&self.gpu.adapter)
    }

    /// One core kernel: y[m, n] = x[m, k] · w[n, k]ᵀ, computed by the same WGSL as native.
    pub async fn linear(&self, x: Vec<f32>, w: Vec<f32>, m: usize, n: usize, k: usize) -> Result<Vec<f32>, JsValue> {
        if x.len() != m * k || w.len() != n * k {
            return Err(js_err(format!("linear: x has {} values and w {}, expected {} and {}", x.len(), w.len(), m * k, n * k)));
        }
        let g = &self.gpu;
        let xb = g.upload_f32("x", &x).map_err(js_err)?;
        let wb = g.upload_f32("w", &w).map_err(js_err)?;
        let yb = g.scratch(m * n).map_err(js_err)?;
        let mut rec = g.recorder();
        nn::linear(&mut rec, &xb, &wb, &yb, m, n, k, false).map_err(js_err)?;
        rec.submit().map_err(js_err)?;
        g.read_f32(&yb, m * n).await.map_err(js_err)
    }
}

fn serde_json_string(v: &linearize_core::gpu::AdapterReport) -> String {
    format!(
        "{{\"name\":{:?},\"backend\":{:?},\"device_type\":{:?},\"max_storage_buffer_binding_size\":{}}}",
        v.name, v.backend, v.device_type, v.max_storage_buffer_binding_size
    )
}
