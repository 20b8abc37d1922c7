//! Which resource an operation touches: unique keys, or a keyspace of up to
//! [`KEYSPACE_MAX`] keys drawn uniformly or by a Zipf law. Seeded; no I/O.

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Largest keyspace accepted.
pub const KEYSPACE_MAX: u64 = 10_000_000;

/// How keys are drawn from the keyspace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Key rank `k` (1-based) with probability proportional to `1 / k^exponent`.
    Zipf {
        /// The exponent `s` (> 0; 1.0 is the classic law, larger is more skewed).
        exponent: f64,
    },
}

/// Errors of a key chooser's configuration.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// Keyspace empty or above [`KEYSPACE_MAX`].
    #[error("keyspace must be within 1..={KEYSPACE_MAX}, not {0}")]
    Keyspace(u64),
    /// Bad Zipf exponent.
    #[error("zipf exponent must be a positive finite number, not {0}")]
    ZipfExponent(f64),
}

/// Draws key indexes of a keyspace.
#[derive(Debug, Clone)]
pub struct KeyChooser {
    keyspace: u64,
    zipf: Option<Zipf<f64>>,
}

impl KeyChooser {
    /// A chooser over `keyspace` keys.
    pub fn new(keyspace: u64, distribution: KeyDistribution) -> Result<Self, KeysError> {
        if keyspace == 0 || keyspace > KEYSPACE_MAX {
            return Err(KeysError::Keyspace(keyspace));
        }
        let zipf = match distribution {
            KeyDistribution::Uniform => None,
            KeyDistribution::Zipf { exponent } => {
                if !(exponent.is_finite() && exponent > 0.0) {
                    return Err(KeysError::ZipfExponent(exponent));
                }
                #[allow(clippy::cast_precision_loss)]
                let n = keyspace as f64;
                Some(Zipf::new(n, exponent).map_err(|_| KeysError::ZipfExponent(exponent))?)
            }
        };
        Ok(KeyChooser { keyspace, zipf })
    }

    /// The number of keys.
    pub fn keyspace(&self) -> u64 {
        self.keyspace
    }

    /// A key index in `0..keyspace`; with Zipf, index 0 is the hottest key.
    pub fn pick(&self, rng: &mut impl Rng) -> u64 {
        match &self.zipf {
            None => rng.random_range(0..self.keyspace),
            Some(zipf) => {
                // The Zipf sample is a rank in 1..=n as a float.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let rank = zipf.sample(rng) as u64;
                rank.clamp(1, self.keyspace) - 1
            }
        }
    }
}

/// The resource id of key index `index` (shared by every target so runs are comparable).
pub fn resource_name(index: u64) -> String {
    format!("r{index:08}")
}

/// A unique resource id for the `acquire` scenario: worker and sequence number.
pub fn unique_resource_name(run_tag: u32, worker: usize, sequence: u64) -> String {
    format!("u{run_tag:08x}-{worker}-{sequence}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn uniform_stays_in_range_and_spreads() {
        let chooser = KeyChooser::new(10, KeyDistribution::Uniform).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let index = chooser.pick(&mut rng);
            seen[usize::try_from(index).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&count| count > 800), "{seen:?}");
    }

    #[test]
    fn zipf_prefers_the_first_keys() {
        let chooser = KeyChooser::new(1000, KeyDistribution::Zipf { exponent: 1.1 }).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut hot = 0;
        for _ in 0..10_000 {
            let index = chooser.pick(&mut rng);
            assert!(index < 1000);
            if index < 10 {
                hot += 1;
            }
        }
        // Under uniform the first 1% of keys would get about 100 of 10,000 picks.
        assert!(hot > 3000, "{hot}");
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(KeyChooser::new(0, KeyDistribution::Uniform).is_err());
        assert!(KeyChooser::new(KEYSPACE_MAX + 1, KeyDistribution::Uniform).is_err());
        assert!(KeyChooser::new(10, KeyDistribution::Zipf { exponent: 0.0 }).is_err());
        assert!(KeyChooser::new(10, KeyDistribution::Zipf { exponent: f64::NAN }).is_err());
    }
}
