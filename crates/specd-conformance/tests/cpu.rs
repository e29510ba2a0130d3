//! The conformance suite on the CPU backend.

const BACKEND: specd_conformance::Loader = specd_conformance::cpu::load;
mod suite;
