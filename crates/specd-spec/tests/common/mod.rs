//! Test models shared by the speculation tests.

use specd_models::{Model, ModelOptions};
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::path::Path;
use std::sync::Arc;

/// Writes a generated model (`preset`, weight `style`, `seed`, with an MTP head if `mtp`) to
/// `dir/name` and loads it with 2 threads and 64-row prompt chunks.
pub fn test_model(
    dir: &Path,
    name: &str,
    preset: Preset,
    style: WeightStyle,
    seed: u64,
    mtp: bool,
) -> Arc<Model> {
    let mut spec = TestModelSpec::preset(preset);
    spec.style = style;
    spec.seed = seed;
    spec.mtp = mtp;
    let p = dir.join(name);
    write_model(&spec, &p).unwrap();
    let opts = ModelOptions {
        n_threads: 2,
        n_ubatch: 64,
    };
    Arc::new(Model::load(p, opts).unwrap())
}
