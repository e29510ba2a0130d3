//! The conformance suite: the properties exact speculation rests on, written once against the
//! backend interface (`specd-backend`) and run for every backend.
//!
//! The tests are in `tests/suite/`: speculative output equal to plain for every drafter ×
//! rollback × sampler, batch invariance, rollback and checkpoints equal to decoding less, slot
//! save / restore, the MTP head through its handles. Each backend is one test file,
//! `tests/<backend>.rs`, that names the backend's [`Loader`] and includes the suite:
//!
//! ```text
//! const BACKEND: specd_conformance::Loader = specd_conformance::cpu::load;
//! mod suite;
//! ```

pub mod cpu;
pub mod models;

use specd_backend::Backend;
use std::path::Path;
use std::sync::Arc;

/// How the suite runs a model: compute threads and rows per forward pass (prompt chunks).
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub n_threads: usize,
    pub n_ubatch: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_threads: 2,
            n_ubatch: 64,
        }
    }
}

/// Loads a GGUF file on the backend under test. A file the backend cannot load fails the test
/// (the suite's files are all meant to load).
pub type Loader = fn(&Path, LoadOptions) -> Arc<dyn Backend>;
