//! Random draws the physics needs on top of `rand`: normal and uniform variates from a
//! seeded, reproducible generator.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A seeded generator with the few distributions the simulator draws from.
#[derive(Debug, Clone)]
pub struct Draw {
    rng: SmallRng,
    spare: Option<f64>,
}

impl Draw {
    /// A generator for `seed`, separated into independent streams by `stream`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mixed = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Draw {
            rng: SmallRng::seed_from_u64(mixed),
            spare: None,
        }
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform integer in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u32) -> u32 {
        ((self.unit() * f64::from(n)) as u32).min(n.saturating_sub(1))
    }

    /// Standard normal, by the Box–Muller transform (two variates per pair of uniforms).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.unit(); // (0, 1]: ln is finite
        let u2 = self.unit();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_unit_moments() {
        let mut d = Draw::new(3, 0);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| d.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<f64> = {
            let mut d = Draw::new(9, 1);
            (0..10).map(|_| d.normal()).collect()
        };
        let mut d = Draw::new(9, 1);
        let b: Vec<f64> = (0..10).map(|_| d.normal()).collect();
        assert_eq!(a, b);
        let mut e = Draw::new(9, 2);
        assert_ne!(a[0], e.normal());
    }
}
