//! The suite: every file holds the tests of one property, run on `crate::BACKEND`.

mod edge_cases;
mod exactness;
mod grammar;
mod memory;
mod mtp;
mod probabilistic;
mod prompt_marks;
mod saved_state;
