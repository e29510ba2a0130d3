//! The CPU backend's loader for the suite.

use crate::LoadOptions;
use specd_backend::Backend;
use specd_models::{CpuBackend, Model, ModelOptions};
use std::path::Path;
use std::sync::Arc;

/// Loads `path` on the CPU backend.
pub fn load(path: &Path, opts: LoadOptions) -> Arc<dyn Backend> {
    let opts = ModelOptions {
        n_threads: opts.n_threads,
        n_ubatch: opts.n_ubatch,
    };
    match Model::load(path, opts) {
        Ok(m) => Arc::new(CpuBackend::new(Arc::new(m))),
        Err(e) => panic!("loading {} on the CPU backend: {e}", path.display()),
    }
}
