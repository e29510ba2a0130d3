//! Sampling parameters, their defaults and their validation.

use serde::{Deserialize, Serialize};

/// Seed value meaning "pick a random seed when the sampler is created".
///
/// Same sentinel as llama.cpp's `LLAMA_DEFAULT_SEED` (`0xFFFFFFFF`). The
/// concrete seed drawn for such a request is exposed by
/// [`Sampler::seed`](crate::Sampler::seed) so the request can be repeated.
pub const RANDOM_SEED: u32 = u32::MAX;

/// A sampling parameter outside its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SamplingError {
    /// `name` had a value outside the documented range.
    #[error("invalid sampling parameter `{name}` = {value}: expected {expected}")]
    InvalidParam {
        /// Field name as it appears in [`SamplerParams`] (and its serde form).
        name: &'static str,
        /// The rejected value (integers are widened to `f64`).
        value: f64,
        /// Human-readable description of the accepted range.
        expected: &'static str,
    },
    /// The grammar (GBNF, Lark, JSON schema or regex) is invalid or cannot be followed.
    #[error("invalid grammar: {0}")]
    Grammar(String),
}

/// Parameters of the sampler chain.
///
/// Defaults follow llama.cpp's `common_params_sampling`. The chain applied by
/// [`Sampler`](crate::Sampler) is, in order: penalties → top-k → typical →
/// top-p → min-p → temperature → draw, each step being a no-op at its
/// "disabled" value. Missing fields deserialise to their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplerParams {
    /// Softmax temperature applied last. `<= 0` selects greedy decoding
    /// (argmax, ties broken towards the lowest token id). Must be finite.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; `<= 0` disables the filter.
    pub top_k: i32,
    /// Nucleus filter: keep the smallest prefix (by descending probability)
    /// whose cumulative probability reaches `top_p`; `1.0` disables it.
    /// Range `[0, 1]`.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the probability
    /// of the most likely token; `0.0` disables it. Range `[0, 1]`.
    pub min_p: f32,
    /// Locally typical sampling mass; `1.0` disables it. Range `[0, 1]`.
    pub typical_p: f32,
    /// Multiplicative repetition penalty: positive logits of tokens present
    /// in the penalty window are divided by it, non-positive ones multiplied.
    /// `1.0` disables it. Must be finite and `> 0`.
    pub repeat_penalty: f32,
    /// Size of the penalty window, counted back from the newest token of the
    /// history: `0` disables all penalties, `-1` means the whole history.
    pub repeat_last_n: i32,
    /// Subtracted once from the logit of every token present in the window.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Seed of the position-keyed random draws; [`RANDOM_SEED`] picks one.
    pub seed: u32,
}

impl Default for SamplerParams {
    fn default() -> Self {
        // llama.cpp common/common.h defaults.
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: RANDOM_SEED,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: temperature 0, everything else at its default (the
    /// filters cannot change the argmax, so they are irrelevant here).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Plain sampling from the softmax of the logits (temperature 1, no top-k / top-p / min-p
    /// filter) with `seed`: the whole distribution stays in play.
    pub fn unfiltered(seed: u32) -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..Self::default()
        }
    }

    /// Whether these parameters select greedy (argmax) decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether any penalty can change a logit (llama.cpp skips the penalty
    /// step under exactly these conditions).
    pub fn penalties_active(&self) -> bool {
        self.repeat_last_n != 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }

    /// Checks every field against its documented range.
    ///
    /// Non-finite floats are always rejected: a NaN would silently turn
    /// every comparison in the chain false and make the output meaningless.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn err(name: &'static str, value: f64, expected: &'static str) -> SamplingError {
            SamplingError::InvalidParam {
                name,
                value,
                expected,
            }
        }
        fn unit(name: &'static str, v: f32) -> Result<(), SamplingError> {
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(err(name, v.into(), "a number in [0, 1]"))
            }
        }
        if !self.temperature.is_finite() {
            return Err(err(
                "temperature",
                self.temperature.into(),
                "a finite number (<= 0 means greedy)",
            ));
        }
        unit("top_p", self.top_p)?;
        unit("min_p", self.min_p)?;
        unit("typical_p", self.typical_p)?;
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(err(
                "repeat_penalty",
                self.repeat_penalty.into(),
                "a finite number > 0 (1 disables it)",
            ));
        }
        if self.repeat_last_n < -1 {
            return Err(err(
                "repeat_last_n",
                self.repeat_last_n.into(),
                "-1 (whole history), 0 (disabled) or a positive window size",
            ));
        }
        if !self.presence_penalty.is_finite() {
            return Err(err(
                "presence_penalty",
                self.presence_penalty.into(),
                "a finite number",
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(err(
                "frequency_penalty",
                self.frequency_penalty.into(),
                "a finite number",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_llama_cpp() {
        let p = SamplerParams::default();
        assert_eq!(p.temperature, 0.8);
        assert_eq!(p.top_k, 40);
        assert_eq!(p.top_p, 0.95);
        assert_eq!(p.min_p, 0.05);
        assert_eq!(p.typical_p, 1.0);
        assert_eq!(p.repeat_penalty, 1.0);
        assert_eq!(p.repeat_last_n, 64);
        assert_eq!(p.presence_penalty, 0.0);
        assert_eq!(p.frequency_penalty, 0.0);
        assert_eq!(p.seed, RANDOM_SEED);
        assert!(!p.penalties_active());
        assert!(p.validate().is_ok());
        assert!(SamplerParams::greedy().is_greedy());
        assert!(SamplerParams::greedy().validate().is_ok());
    }

    #[test]
    fn validation_rejects_out_of_range_values() {
        let bad: Vec<(&str, SamplerParams)> = vec![
            (
                "temperature",
                SamplerParams {
                    temperature: f32::NAN,
                    ..Default::default()
                },
            ),
            (
                "temperature",
                SamplerParams {
                    temperature: f32::INFINITY,
                    ..Default::default()
                },
            ),
            (
                "top_p",
                SamplerParams {
                    top_p: -0.1,
                    ..Default::default()
                },
            ),
            (
                "top_p",
                SamplerParams {
                    top_p: 1.5,
                    ..Default::default()
                },
            ),
            (
                "top_p",
                SamplerParams {
                    top_p: f32::NAN,
                    ..Default::default()
                },
            ),
            (
                "min_p",
                SamplerParams {
                    min_p: -1.0,
                    ..Default::default()
                },
            ),
            (
                "typical_p",
                SamplerParams {
                    typical_p: 2.0,
                    ..Default::default()
                },
            ),
            (
                "repeat_penalty",
                SamplerParams {
                    repeat_penalty: 0.0,
                    ..Default::default()
                },
            ),
            (
                "repeat_penalty",
                SamplerParams {
                    repeat_penalty: -1.1,
                    ..Default::default()
                },
            ),
            (
                "repeat_penalty",
                SamplerParams {
                    repeat_penalty: f32::NAN,
                    ..Default::default()
                },
            ),
            (
                "repeat_last_n",
                SamplerParams {
                    repeat_last_n: -2,
                    ..Default::default()
                },
            ),
            (
                "presence_penalty",
                SamplerParams {
                    presence_penalty: f32::NEG_INFINITY,
                    ..Default::default()
                },
            ),
            (
                "frequency_penalty",
                SamplerParams {
                    frequency_penalty: f32::NAN,
                    ..Default::default()
                },
            ),
        ];
        for (field, p) in bad {
            match p.validate() {
                Err(SamplingError::InvalidParam { name, .. }) => assert_eq!(name, field),
                other => panic!("{field}: expected an error, got {other:?}"),
            }
        }
        let err = SamplerParams {
            top_p: -0.5,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("top_p"), "{err}");
    }

    #[test]
    fn validation_accepts_edge_values() {
        let ok = [
            SamplerParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplerParams {
                top_k: -1,
                ..Default::default()
            },
            SamplerParams {
                top_p: 0.0,
                min_p: 1.0,
                typical_p: 0.0,
                ..Default::default()
            },
            SamplerParams {
                repeat_last_n: -1,
                repeat_penalty: 0.5,
                ..Default::default()
            },
            SamplerParams {
                presence_penalty: -2.0,
                frequency_penalty: 2.0,
                seed: 0,
                ..Default::default()
            },
        ];
        for p in ok {
            assert!(p.validate().is_ok(), "{p:?}");
        }
    }

    #[test]
    fn serde_round_trip_and_partial_input() {
        let p = SamplerParams {
            top_k: 7,
            seed: 42,
            ..Default::default()
        };
        let json = serde_json::to_string(&p).unwrap();
        let back: SamplerParams = serde_json::from_str(&json).unwrap();
        assert_eq!(p, back);
        let partial: SamplerParams = serde_json::from_str(r#"{"temperature":0.0}"#).unwrap();
        assert_eq!(partial, SamplerParams::greedy());
    }
}
