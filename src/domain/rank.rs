//! Confidence-adjusted ranks of averages (issue 24, item 4): the Bayesian
//! weighted rating and the Wilson lower bound, as pure functions with the
//! validation of their parameters, so a store ranks with the same numbers
//! the API documents and a test can check them by hand.
//!
//! Neither function ever returns NaN or an infinity: inputs that would give
//! one are refused (`None` or an error naming the parameter).

/// How a list of averages is ordered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rank {
    /// `sum / quantity` descending (the default, unchanged).
    Average,
    /// `v/(v+m)·R + m/(v+m)·C`: `v` the target's quantity, `R` its average,
    /// `m` the prior weight, `C` the mean of the averages considered.
    Bayesian { prior_weight: f64 },
    /// The lower bound of the Wilson interval at `z` for the average rescaled
    /// to `[0, 1]` by the rating scale `lo..hi`, over `n = quantity`.
    Wilson { lo: i64, hi: i64, z: f64 },
}

/// The default `z` of [`Rank::Wilson`] (a 95 % interval).
pub const DEFAULT_Z: f64 = 1.96;
/// The largest `z` accepted; beyond it every bound is close to 0 anyway.
pub const MAX_Z: f64 = 10.0;
/// The largest prior weight accepted, so `v + m` stays far inside a double.
pub const MAX_PRIOR_WEIGHT: f64 = 1e12;

/// The Bayesian weighted rating of `sum / quantity` towards the mean `c`
/// with weight `m`; `None` when `quantity + m` is not positive or an input
/// is not finite.
pub fn bayesian(sum: i128, quantity: i128, m: f64, c: f64) -> Option<f64> {
    let v = quantity as f64;
    let total = v + m;
    if !m.is_finite() || !c.is_finite() || m < 0.0 || quantity < 0 || total <= 0.0 {
        return None;
    }
    // v/(v+m)·R + m/(v+m)·C with R = sum/v, written without dividing by v
    // so a target without samples weighs only the prior.
    let score = (sum as f64 + m * c) / total;
    score.is_finite().then_some(score)
}

/// The average lies outside the rating scale, so it has no proportion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutOfScale {
    pub average: f64,
}

/// The Wilson lower bound of `(sum / quantity - lo) / (hi - lo)` over
/// `n = quantity` at `z`. `Ok(None)` without samples; `Err` when the average
/// is outside `lo..=hi`. Expects `lo < hi` and `0 < z <= MAX_Z`
/// ([`parse_scale`], [`parse_z`]).
pub fn wilson(
    sum: i128,
    quantity: i128,
    lo: i64,
    hi: i64,
    z: f64,
) -> Result<Option<f64>, OutOfScale> {
    if quantity <= 0 || lo >= hi || z.is_nan() || z <= 0.0 || z > MAX_Z {
        return Ok(None);
    }
    let n = quantity as f64;
    let average = sum as f64 / n;
    let p = (average - lo as f64) / (hi as f64 - lo as f64);
    if !(0.0..=1.0).contains(&p) {
        return Err(OutOfScale { average });
    }
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // The bound is never below 0 in exact arithmetic; rounding can dip it.
    let bound = ((centre - spread) / (1.0 + z2 / n)).max(0.0);
    Ok(bound.is_finite().then_some(bound))
}

/// `scale=lo..hi`: two integers with `lo < hi`.
pub fn parse_scale(text: &str) -> Result<(i64, i64), String> {
    let bad = || format!("scale: expected two integers lo..hi with lo < hi, got `{text}`");
    let (lo, hi) = text.split_once("..").ok_or_else(bad)?;
    let lo: i64 = lo.trim().parse().map_err(|_| bad())?;
    let hi: i64 = hi.trim().parse().map_err(|_| bad())?;
    if lo >= hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// `z`: a finite number with `0 < z <= 10`.
pub fn parse_z(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(z) if z > 0.0 && z <= MAX_Z => Ok(z),
        _ => Err(format!(
            "z: expected a number with 0 < z <= {MAX_Z}, got `{text}`"
        )),
    }
}

/// `prior_weight`: a finite number with `0 <= m <= 1e12`.
pub fn parse_prior_weight(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(m) if (0.0..=MAX_PRIOR_WEIGHT).contains(&m) => Ok(m),
        _ => Err(format!(
            "prior_weight: expected a number with 0 <= prior_weight <= {MAX_PRIOR_WEIGHT}, got `{text}`"
        )),
    }
}

/// The mean of the averages `sum / quantity` of the targets with samples;
/// `None` when there is none.
pub fn mean_of_averages(targets: impl IntoIterator<Item = (i128, i128)>) -> Option<f64> {
    let mut mean = MeanOfAverages::default();
    for (sum, quantity) in targets {
        mean.push(sum, quantity);
    }
    mean.mean()
}

/// [`mean_of_averages`] taken as rows come in. The sum is a plain running
/// sum of doubles, so its last bits depend on the order: every store feeds
/// it in uuid order (bytewise), and the same rows give the same mean, to the
/// bit, on each of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MeanOfAverages {
    total: f64,
    count: u64,
}

impl MeanOfAverages {
    /// Adds one target; one without samples is left out.
    pub fn push(&mut self, sum: i128, quantity: i128) {
        if quantity > 0 {
            self.total += sum as f64 / quantity as f64;
            self.count += 1;
        }
    }

    /// How many targets with samples were added.
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0)
            .then(|| self.total / self.count as f64)
            .filter(|c| c.is_finite())
    }
}

impl Rank {
    /// The score of one target, `None` when it has none (no samples).
    /// `prior_mean` is `C` of [`Rank::Bayesian`] (unused by the others).
    pub fn score(
        &self,
        sum: i128,
        quantity: i128,
        prior_mean: f64,
    ) -> Result<Option<f64>, OutOfScale> {
        match *self {
            Rank::Average => Ok((quantity > 0).then(|| sum as f64 / quantity as f64)),
            Rank::Bayesian { prior_weight } => {
                Ok(bayesian(sum, quantity, prior_weight, prior_mean))
            }
            Rank::Wilson { lo, hi, z } => wilson(sum, quantity, lo, hi, z),
        }
    }

    /// The `rank` parameter's name of this rank.
    pub fn name(&self) -> &'static str {
        match self {
            Rank::Average => "none",
            Rank::Bayesian { .. } => "bayesian",
            Rank::Wilson { .. } => "wilson",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-5
    }

    /// One 5-star rating against 400 averaging 4.8, in a catalogue whose
    /// averages have mean 3.5, with m = 10 (by hand: 40/11 and 1955/410).
    #[test]
    fn bayesian_puts_many_ratings_above_one_five_star() {
        let one = bayesian(5, 1, 10.0, 3.5).unwrap();
        let many = bayesian(1920, 400, 10.0, 3.5).unwrap();
        assert!(close(one, 40.0 / 11.0), "{one}");
        assert!(close(many, 1955.0 / 410.0), "{many}");
        assert!(many > one);
    }

    #[test]
    fn bayesian_with_no_weight_is_the_average_and_no_samples_is_the_prior() {
        assert!(close(bayesian(9, 2, 0.0, 1.0).unwrap(), 4.5));
        assert!(close(bayesian(0, 0, 3.0, 2.5).unwrap(), 2.5));
        assert_eq!(bayesian(0, 0, 0.0, 2.5), None);
        assert_eq!(bayesian(5, 1, f64::NAN, 2.5), None);
    }

    /// By hand, z = 1.96 on the scale 1..5: one 5 gives p = 1, n = 1, bound
    /// 1 / (1 + 3.8416) = 0.206543; 400 averaging 4.8 give p = 0.95, bound
    /// (0.95 + 0.004802 - 1.96·sqrt(0.00011875 + 0.0000060025)) / 1.009604
    /// = 0.924037.
    #[test]
    fn wilson_puts_many_ratings_above_one_five_star() {
        let one = wilson(5, 1, 1, 5, DEFAULT_Z).unwrap().unwrap();
        let many = wilson(1920, 400, 1, 5, DEFAULT_Z).unwrap().unwrap();
        assert!(close(one, 1.0 / 4.8416), "{one}");
        assert!((many - 0.924037).abs() < 1e-5, "{many}");
        assert!(many > one);
    }

    #[test]
    fn wilson_refuses_averages_outside_the_scale_and_never_gives_nan() {
        assert_eq!(
            wilson(6, 1, 1, 5, DEFAULT_Z),
            Err(OutOfScale { average: 6.0 })
        );
        assert_eq!(
            wilson(0, 1, 1, 5, DEFAULT_Z),
            Err(OutOfScale { average: 0.0 })
        );
        assert_eq!(wilson(0, 0, 1, 5, DEFAULT_Z), Ok(None));
        // All at the bottom of the scale: p = 0, the bound is 0, not -0 or NaN.
        assert_eq!(wilson(3, 3, 1, 5, DEFAULT_Z), Ok(Some(0.0)));
    }

    #[test]
    fn parameters_are_validated_with_their_names() {
        assert_eq!(parse_scale("1..5"), Ok((1, 5)));
        assert_eq!(parse_scale("-2..2"), Ok((-2, 2)));
        for bad in ["5..1", "3..3", "1-5", "1.5..5", "..5", ""] {
            assert!(parse_scale(bad).unwrap_err().starts_with("scale:"), "{bad}");
        }
        assert_eq!(parse_z("2.58"), Ok(2.58));
        for bad in ["0", "-1", "10.5", "NaN", "inf", "x"] {
            assert!(parse_z(bad).unwrap_err().starts_with("z:"), "{bad}");
        }
        assert_eq!(parse_prior_weight("0"), Ok(0.0));
        for bad in ["-1", "NaN", "inf", "1e13"] {
            let e = parse_prior_weight(bad).unwrap_err();
            assert!(e.starts_with("prior_weight:"), "{bad}");
        }
    }

    #[test]
    fn the_mean_of_averages_skips_targets_without_samples() {
        assert_eq!(mean_of_averages([(5, 1), (8, 2), (0, 0)]), Some(4.5));
        assert_eq!(mean_of_averages([(0, 0)]), None);
        let mut m = MeanOfAverages::default();
        m.push(9, 2);
        m.push(3, 0);
        assert_eq!((m.count(), m.mean()), (1, Some(4.5)));
    }

    #[test]
    fn a_rank_scores_with_its_formula() {
        let b = Rank::Bayesian { prior_weight: 10.0 };
        assert!(close(b.score(5, 1, 3.5).unwrap().unwrap(), 40.0 / 11.0));
        let w = Rank::Wilson {
            lo: 1,
            hi: 5,
            z: DEFAULT_Z,
        };
        assert!(close(
            w.score(5, 1, f64::NAN).unwrap().unwrap(),
            1.0 / 4.8416
        ));
        assert_eq!(w.score(6, 1, 0.0), Err(OutOfScale { average: 6.0 }));
        assert_eq!(Rank::Average.score(9, 2, 0.0), Ok(Some(4.5)));
    }
}
