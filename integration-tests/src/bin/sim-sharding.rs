//! How much asset state each resolver instance must hold at 100,000,000 assets and
//! 10,000,000 dependencies, under three ways of spreading the dependencies over
//! instances — a simulation at full size (it holds one bit per asset per instance,
//! not the states), for `docs/decisions/0006-resolver-state-past-one-machine.md`.
//!
//!   cargo run --release -p sluice-integration-tests --bin sim-sharding -- [assets] [dependencies] [zipf exponent]
//!
//! Defaults: 100,000,000 assets, 10,000,000 dependencies, exponent 1.0. A
//! dependency reads 1 input (50 %), 2 (30 %), or 3 to 5 (20 %); inputs are drawn by
//! popularity (Zipf: a few dimension tables are read by very many dependencies,
//! most tables by few), the popular ones spread over the partitions.
//!
//! The ways: every instance holds every asset (today's global table);
//! dependencies spread by a hash of their id, each instance holding what its
//! dependencies read; dependencies placed with their least popular input's
//! asset-state partition, each instance holding its partitions' read assets and
//! the inputs of its dependencies that live on other instances.

use std::time::Instant;

/// Partitions of the asset-state topic.
const PARTITIONS: u64 = 256;

/// xorshift64*: deterministic, so every run draws the same dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Bits(Vec<u64>);

impl Bits {
    fn new(n: u64) -> Bits {
        Bits(vec![0; n.div_ceil(64) as usize])
    }
    fn set(&mut self, i: u64) {
        self.0[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn count(&self) -> u64 {
        self.0.iter().map(|w| w.count_ones() as u64).sum()
    }
}

/// A popularity rank (0 = most read) drawn from a Zipf-like law over `n` by the
/// inverse of its continuous CDF.
fn zipf_rank(rng: &mut Rng, n: u64, s: f64) -> u64 {
    let u = rng.unit();
    let r = if (s - 1.0).abs() < 1e-9 {
        (n as f64).powf(u)
    } else {
        let a = (n as f64).powf(1.0 - s);
        ((a - 1.0) * u + 1.0).powf(1.0 / (1.0 - s))
    };
    (r as u64).saturating_sub(1).min(n - 1)
}

/// The asset of a rank: multiplying by a prime that does not divide n is a
/// bijection mod n, and scatters the popular assets over the partitions.
fn asset_of(rank: u64, n: u64) -> u64 {
    const PRIME: u128 = 1_000_000_007;
    ((rank as u128 * PRIME) % n as u128) as u64
}

fn partition(asset: u64) -> u64 {
    (asset.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 32) % PARTITIONS
}

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let assets = args.first().map_or(100_000_000, |&a| a as u64);
    assert!(
        !assets.is_multiple_of(1_000_000_007) && assets > 0,
        "the asset count must not be a multiple of the scattering prime"
    );
    let deps = args.get(1).map_or(10_000_000, |&d| d as u64);
    let s = args.get(2).copied().unwrap_or(1.0);
    let shard_counts = [4u64, 16, 64];
    let started = Instant::now();

    let mut read = Bits::new(assets);
    // [shard count][instance]: what each instance must hold.
    let mut by_hash: Vec<Vec<Bits>> = shard_counts
        .iter()
        .map(|&n| (0..n).map(|_| Bits::new(assets)).collect())
        .collect();
    let mut by_partition: Vec<Vec<Bits>> = shard_counts
        .iter()
        .map(|&n| (0..n).map(|_| Bits::new(assets)).collect())
        .collect();
    let mut remote_deps = vec![0u64; shard_counts.len()];
    let mut inputs_total = 0u64;
    let mut rng = Rng(0x5EED_5EED_5EED_5EED);
    let mut inputs = Vec::with_capacity(5);
    for d in 0..deps {
        let n = match rng.unit() {
            x if x < 0.5 => 1,
            x if x < 0.8 => 2,
            _ => 3 + rng.next() % 3,
        };
        inputs.clear();
        for _ in 0..n {
            let rank = zipf_rank(&mut rng, assets, s);
            inputs.push((rank, asset_of(rank, assets)));
        }
        inputs_total += n;
        // The least popular input: the one fewest other dependencies share.
        let anchor = inputs.iter().max_by_key(|(rank, _)| *rank).expect("one").1;
        let home_partition = partition(anchor);
        let dep_hash = (d.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as usize;
        for (k, &shards) in shard_counts.iter().enumerate() {
            let hashed = dep_hash % shards as usize;
            let home = (home_partition * shards / PARTITIONS) as usize;
            let mut remote = false;
            for &(_, a) in &inputs {
                by_hash[k][hashed].set(a);
                by_partition[k][home].set(a);
                remote |= (partition(a) * shards / PARTITIONS) as usize != home;
            }
            remote_deps[k] += remote as u64;
        }
        for &(_, a) in &inputs {
            read.set(a);
        }
    }
    let read_assets = read.count();
    println!(
        "sim-sharding: {assets} assets, {deps} dependencies ({:.2} inputs each), Zipf exponent {s}, {PARTITIONS} asset-state partitions ({:.0} s)",
        inputs_total as f64 / deps as f64,
        started.elapsed().as_secs_f64()
    );
    println!(
        "assets read by at least one dependency: {read_assets} ({:.1} % of all)\n",
        read_assets as f64 * 100.0 / assets as f64
    );
    println!(
        "| instances | way | assets held per instance (max) | of all assets | dependencies with an input on another instance |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (k, &shards) in shard_counts.iter().enumerate() {
        let held = |sets: &[Bits]| sets.iter().map(Bits::count).max().unwrap_or(0);
        let rows = [
            ("every asset (today)", assets, "—".to_owned()),
            ("the read assets, replicated", read_assets, "—".to_owned()),
            (
                "dependencies by hash of their id",
                held(&by_hash[k]),
                "—".to_owned(),
            ),
            (
                "dependencies with their least popular input's partition",
                held(&by_partition[k]),
                format!("{:.1} %", remote_deps[k] as f64 * 100.0 / deps as f64),
            ),
        ];
        for (way, n, remote) in rows {
            println!(
                "| {shards} | {way} | {n} | {:.1} % | {remote} |",
                n as f64 * 100.0 / assets as f64
            );
        }
    }
}
