//! Go's `math/rand` generator, value for value: the seeded additive lagged-Fibonacci source
//! (`rngSource`) and the `Rand` methods the reference simulator draws with (`Int`, `Intn`,
//! `Shuffle`, `Perm`). With it, seed 42 here shuffles, resamples and ranks nodes exactly as seed
//! 42 did in the paper's runs, so the reference policies are compared draw for draw, not only in
//! distribution.
//!
//! Go seeds every source from a fixed table (`rngCooked`): the register of the same generator,
//! seeded with 1, after 7.8·10¹² steps. Rather than carry 607 opaque constants, the table is
//! computed here from that definition by jumping ahead (x^N mod the generator's characteristic
//! polynomial), once per process, in a few milliseconds.

use std::sync::OnceLock;

/// The register length and the short lag (`rngLen`, `rngTap`).
const LEN: usize = 607;
const TAP: usize = 273;
/// Where the feed index starts after seeding.
const FEED_START: usize = LEN - TAP;
/// Seeding's modulus, 2³¹ − 1.
const INT32_MAX: i64 = (1 << 31) - 1;
/// The steps `rngCooked` is the register after (`gen_cooked.go`).
const COOKED_STEPS: u64 = 7_800_000_000_000;

/// Go's `math/rand.Rand` over its default source, seeded like `rand.Seed(seed)`.
#[derive(Clone)]
pub struct GoRand {
    register: [u64; LEN],
    tap: usize,
    feed: usize,
}

impl std::fmt::Debug for GoRand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoRand")
            .field("tap", &self.tap)
            .field("feed", &self.feed)
            .finish_non_exhaustive()
    }
}

impl GoRand {
    /// The source as `rand.NewSource(seed)` makes it.
    pub fn new(seed: i64) -> Self {
        let mut seed = seed % INT32_MAX;
        if seed < 0 {
            seed += INT32_MAX;
        }
        if seed == 0 {
            seed = 89_482_311;
        }
        let cooked = cooked();
        let register = seeded_register(seed, [40, 20], |i, value| value ^ cooked[i]);
        Self {
            register,
            tap: 0,
            feed: FEED_START,
        }
    }

    /// `Uint64`: one step of the generator.
    fn step(&mut self) -> u64 {
        self.tap = self.tap.checked_sub(1).unwrap_or(LEN - 1);
        self.feed = self.feed.checked_sub(1).unwrap_or(LEN - 1);
        let value = self.register[self.feed].wrapping_add(self.register[self.tap]);
        self.register[self.feed] = value;
        value
    }

    /// `Int63`: 63 uniform bits.
    pub fn int63(&mut self) -> i64 {
        (self.step() & (u64::MAX >> 1)) as i64
    }

    /// `Uint32`: the top 32 of the 63 bits.
    pub fn uint32(&mut self) -> u32 {
        (self.int63() >> 31) as u32
    }

    /// `Int31`: the top 31 of the 63 bits.
    pub fn int31(&mut self) -> i32 {
        (self.int63() >> 32) as i32
    }

    /// `Int`: a non-negative int (64-bit platform).
    pub fn int(&mut self) -> i64 {
        self.int63()
    }

    /// `Int31n`: uniform in `0..n` by rejection (the Go 1 stream `Intn` keeps). `n` must be
    /// positive; 0 answers 0 without drawing.
    pub fn int31n(&mut self, n: i32) -> i32 {
        if n <= 0 {
            return 0;
        }
        if n & (n - 1) == 0 {
            return self.int31() & (n - 1);
        }
        let max = (i32::MAX as u32 - (1u32 << 31) % n as u32) as i32;
        let mut value = self.int31();
        while value > max {
            value = self.int31();
        }
        value % n
    }

    /// `Int63n`: uniform in `0..n` by rejection; 0 for a non-positive `n`.
    pub fn int63n(&mut self, n: i64) -> i64 {
        if n <= 0 {
            return 0;
        }
        if n & (n - 1) == 0 {
            return self.int63() & (n - 1);
        }
        let max = (i64::MAX as u64 - (1u64 << 63) % n as u64) as i64;
        let mut value = self.int63();
        while value > max {
            value = self.int63();
        }
        value % n
    }

    /// `Intn`: uniform in `0..n` (`Int31n` below 2³¹, `Int63n` above); 0 for `n == 0`.
    pub fn intn(&mut self, n: usize) -> usize {
        if n <= i32::MAX as usize {
            self.int31n(n as i32) as usize
        } else {
            self.int63n(n as i64) as usize
        }
    }

    /// `int31n`: Lemire's multiply-shift draw, used by `Shuffle`.
    fn int31n_fast(&mut self, n: u32) -> u32 {
        let mut product = u64::from(self.uint32()) * u64::from(n);
        if (product as u32) < n {
            let threshold = n.wrapping_neg() % n;
            while (product as u32) < threshold {
                product = u64::from(self.uint32()) * u64::from(n);
            }
        }
        (product >> 32) as u32
    }

    /// `Shuffle`: Fisher–Yates from the back, swapping with `swap(i, j)`.
    pub fn shuffle(&mut self, n: usize, mut swap: impl FnMut(usize, usize)) {
        let mut i = n.saturating_sub(1);
        while i > (i32::MAX - 1) as usize {
            let j = self.int63n(i as i64 + 1) as usize;
            swap(i, j);
            i -= 1;
        }
        while i > 0 {
            let j = self.int31n_fast(i as u32 + 1) as usize;
            swap(i, j);
            i -= 1;
        }
    }

    /// `Perm`: a permutation of `0..n`, built by inside-out insertion.
    pub fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut perm = vec![0; n];
        for i in 0..n {
            let j = self.intn(i + 1);
            perm[i] = perm[j];
            perm[j] = i;
        }
        perm
    }
}

/// Go's seeding generator: x·48271 mod (2³¹ − 1), by Schrage's method as Go writes it.
fn seed_step(x: i64) -> i64 {
    const A: i64 = 48_271;
    const Q: i64 = 44_488;
    const R: i64 = 3_399;
    let next = A * (x % Q) - R * (x / Q);
    if next < 0 { next + INT32_MAX } else { next }
}

/// The register a seed fills: 20 discarded steps, then per slot three steps mixed with the given
/// shifts (`Seed` uses 40/20 and XORs `rngCooked`; `gen_cooked.go` uses 20/10 and nothing).
fn seeded_register(seed: i64, shifts: [u32; 2], finish: impl Fn(usize, u64) -> u64) -> [u64; LEN] {
    let mut x = seed;
    for _ in 0..20 {
        x = seed_step(x);
    }
    std::array::from_fn(|slot| {
        x = seed_step(x);
        let mut value = (x as u64) << shifts[0];
        x = seed_step(x);
        value ^= (x as u64) << shifts[1];
        x = seed_step(x);
        value ^= x as u64;
        finish(slot, value)
    })
}

/// `rngCooked`, computed once.
fn cooked() -> &'static [u64; LEN] {
    static COOKED: OnceLock<[u64; LEN]> = OnceLock::new();
    COOKED.get_or_init(|| {
        let start = seeded_register(1, [20, 10], |_, value| value);
        advance(&start, FEED_START, COOKED_STEPS)
    })
}

/// The register after `steps` steps of the generator from `register` with the feed index at
/// `feed` (the tap is always `TAP` slots behind it), computed without stepping.
///
/// Step t writes out(t) = out(t − 607) + out(t − 273) into the slot the feed then points at, so
/// the register holds the last 607 terms of a linear recurrence with characteristic polynomial
/// P(x) = x⁶⁰⁷ − x³³⁴ − 1. With r(x) = x^steps mod P = Σ cᵢxⁱ, out(t + steps) = Σ cᵢ·out(t + i),
/// which needs the 607 terms held and the 606 after them.
fn advance(register: &[u64; LEN], feed: usize, steps: u64) -> [u64; LEN] {
    // Term k of the window is out(k − 606): out(−j) sits j slots past the feed.
    let mut window = vec![0u64; 2 * LEN - 1];
    for (k, term) in window.iter_mut().enumerate().take(LEN) {
        *term = register[(feed + LEN - 1 - k) % LEN];
    }
    for k in LEN..window.len() {
        window[k] = window[k - LEN].wrapping_add(window[k - TAP]);
    }
    let jump = power_of_x(steps);
    let new_feed = (feed + LEN - (steps % LEN as u64) as usize) % LEN;
    let mut next = [0u64; LEN];
    // out(steps − 606 + j) lands 606 − j slots past the new feed.
    for j in 0..LEN {
        let term = jump
            .iter()
            .zip(&window[j..j + LEN])
            .fold(0u64, |sum, (&c, &w)| sum.wrapping_add(c.wrapping_mul(w)));
        next[(new_feed + LEN - 1 - j) % LEN] = term;
    }
    next
}

/// x^n mod P(x) over the integers mod 2⁶⁴, coefficients lowest first.
fn power_of_x(n: u64) -> Vec<u64> {
    let mut result = vec![0u64; LEN];
    result[0] = 1;
    for bit in (0..u64::BITS - n.leading_zeros()).rev() {
        result = reduce(multiply(&result, &result));
        if n >> bit & 1 == 1 {
            result.insert(0, 0);
            result = reduce(result);
        }
    }
    result
}

fn multiply(a: &[u64], b: &[u64]) -> Vec<u64> {
    let mut product = vec![0u64; a.len() + b.len() - 1];
    for (i, &x) in a.iter().enumerate() {
        if x == 0 {
            continue;
        }
        for (term, &y) in product[i..].iter_mut().zip(b) {
            *term = term.wrapping_add(x.wrapping_mul(y));
        }
    }
    product
}

/// Reduces modulo P: x^d = x^(d−607)·(x³³⁴ + 1), from the top down.
fn reduce(mut poly: Vec<u64>) -> Vec<u64> {
    for degree in (LEN..poly.len()).rev() {
        let coefficient = poly[degree];
        poly[degree - LEN] = poly[degree - LEN].wrapping_add(coefficient);
        poly[degree - TAP] = poly[degree - TAP].wrapping_add(coefficient);
    }
    poly.truncate(LEN);
    poly.resize(LEN, 0);
    poly
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps the `gen_cooked.go` generator one call at a time.
    fn stepped(register: &[u64; LEN], steps: u64) -> [u64; LEN] {
        let mut generator = GoRand {
            register: *register,
            tap: 0,
            feed: FEED_START,
        };
        for _ in 0..steps {
            generator.step();
        }
        generator.register
    }

    #[test]
    fn jumping_ahead_equals_stepping() {
        let start = seeded_register(1, [20, 10], |_, value| value);
        for steps in [0, 1, 2, 272, 273, 334, 606, 607, 608, 1213, 5000, 123_457] {
            assert_eq!(
                advance(&start, FEED_START, steps),
                stepped(&start, steps),
                "{steps} steps"
            );
        }
    }

    #[test]
    fn the_cooked_table_is_gos() {
        // The first and last entries of `rngCooked` in Go's math/rand/rng.go.
        let cooked = cooked();
        assert_eq!(cooked[0] as i64, -4_181_792_142_133_755_926);
        assert_eq!(cooked[1] as i64, -4_576_982_950_128_230_565);
        assert_eq!(cooked[2] as i64, 1_395_769_623_340_756_751);
    }

    #[test]
    fn degenerate_arguments_do_not_panic() {
        let mut go = GoRand::new(0);
        assert_eq!(go.intn(0), 0);
        assert_eq!(go.int63n(-3), 0);
        go.shuffle(0, |_, _| unreachable!("nothing to swap"));
        go.shuffle(1, |_, _| unreachable!("nothing to swap"));
        assert!(go.perm(0).is_empty());
        let mut negative = GoRand::new(-5);
        assert!(negative.intn(10) < 10);
    }

    #[test]
    fn perm_is_a_permutation() {
        let mut go = GoRand::new(42);
        let mut perm = go.perm(1213);
        perm.sort_unstable();
        assert_eq!(perm, (0..1213).collect::<Vec<_>>());
    }
}
