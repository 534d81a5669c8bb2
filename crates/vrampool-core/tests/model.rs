//! Model-based property test of the pool: random sequences of alloc / free / trim over several
//! streams, checked after every step against a plain record of what should be live.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{BlockState, Device, Pool, PoolConfig, PoolError, SimDevice, SimMode, StreamId};

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
    },
    /// Frees the n-th live block (modulo the count).
    Free {
        nth: usize,
        other_stream: bool,
    },
    FreeBogus {
        addr: u64,
    },
    Trim,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        3 => 4096u64..(1 << 20),
        2 => (1u64 << 20)..(40 << 20),
        1 => (40u64 << 20)..(200 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (size(), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        5 => (any::<usize>(), prop::bool::weighted(0.1)).prop_map(|(nth, other_stream)| Op::Free { nth, other_stream }),
        1 => any::<u64>().prop_map(|addr| Op::FreeBogus { addr }),
        1 => Just(Op::Trim),
    ]
}

fn strategy_kind() -> impl Strategy<Value = StrategyKind> {
    prop_oneof![Just(StrategyKind::Hybrid), Just(StrategyKind::Slab), Just(StrategyKind::BestFit), Just(StrategyKind::Buddy)]
}

/// Everything the pool reports must agree with the model.
fn check(pool: &Pool, dev: &SimDevice, live: &BTreeMap<u64, (u64, u64)>) {
    let stats = pool.stats();
    let snapshot = pool.snapshot();
    let mut active = BTreeMap::new();
    let mut reserved = 0;
    for seg in &snapshot {
        reserved += seg.size;
        let mut cursor = seg.base;
        for &(addr, size, state) in &seg.blocks {
            assert_eq!(addr, cursor, "blocks and free ranges tile the segment");
            cursor += size;
            if let BlockState::Active { requested } = state {
                active.insert(addr, (size, requested));
            }
        }
        assert_eq!(cursor, seg.base + seg.size, "blocks and free ranges cover the segment");
    }
    assert_eq!(reserved, stats.reserved_bytes.current, "reserved = sum of segments");
    assert_eq!(reserved, dev.counters().used, "the device agrees");
    assert_eq!(active.len(), live.len(), "every live block is active, and only those");
    let mut last_end = 0;
    for (&addr, &(size, requested)) in &active {
        let (want_requested, _) = live[&addr];
        assert_eq!(requested, want_requested);
        assert!(size >= requested && addr % 512 == 0);
        assert!(addr >= last_end, "live blocks never overlap");
        last_end = addr + size;
    }
    assert_eq!(stats.allocated_bytes.current, active.values().map(|b| b.0).sum::<u64>());
    assert_eq!(stats.requested_bytes.current, live.values().map(|b| b.0).sum::<u64>());
    assert!(stats.allocated_bytes.current <= stats.reserved_bytes.current);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_the_model(kind in strategy_kind(), ops in prop::collection::vec(op(), 1..120)) {
        let dev = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig { strategy: kind, ..PoolConfig::default() }).unwrap();
        // addr -> (requested, stream)
        let mut live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => match pool.allocate(size, StreamId(stream)) {
                    Ok(addr) => prop_assert!(live.insert(addr, (size, stream)).is_none(), "address handed out twice"),
                    Err(PoolError::OutOfMemory(r)) => prop_assert_eq!(r.requested, size),
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                },
                Op::Free { nth, other_stream } => {
                    if live.is_empty() { continue; }
                    let addr = *live.keys().nth(nth % live.len()).unwrap();
                    let (size, stream) = live.remove(&addr).unwrap();
                    let on = other_stream.then_some(StreamId(stream + 1));
                    prop_assert!(pool.free(addr, Some(size), on).is_ok());
                    prop_assert!(pool.free(addr, Some(size), None).is_err(), "second free refused");
                }
                Op::FreeBogus { addr } => {
                    if !live.contains_key(&addr) {
                        prop_assert!(pool.free(addr, None, None).is_err());
                    }
                }
                Op::Trim => { pool.trim().unwrap(); }
            }
            check(&pool, &dev, &live);
        }
        for (&addr, &(size, _)) in &live {
            pool.free(addr, Some(size), None).unwrap();
        }
        pool.trim().unwrap();
        prop_assert_eq!(pool.stats().reserved_bytes.current, 0);
        prop_assert_eq!(dev.counters().used, 0, "nothing leaks");
    }
}
