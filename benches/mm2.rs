//! Costs of the replication core's hot paths: record encode/decode, offset translation,
//! store updates, the sync policy, and the filters.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use mirrorflow::mm2::{
    Checkpoint, Filters, OffsetSync, OffsetSyncStore, PrefixPolicy, StoreConfig, SyncOrigin,
    SyncPolicy, SyncPolicyConfig, TopicPartition,
};

fn checkpoint() -> Checkpoint {
    Checkpoint {
        group: "payments-service".into(),
        topic_partition: TopicPartition::new("primary.orders", 7),
        upstream_offset: 123_456_789,
        downstream_offset: 123_400_000,
        metadata: String::new(),
    }
}

fn records(c: &mut Criterion) {
    let cp = checkpoint();
    let rec = cp.encode().expect("valid checkpoint");
    c.bench_function("checkpoint_encode", |b| b.iter(|| black_box(&cp).encode()));
    c.bench_function("checkpoint_decode", |b| {
        b.iter(|| Checkpoint::decode(black_box(&rec.key), black_box(&rec.value)))
    });
    let sync = OffsetSync::new(TopicPartition::new("orders", 7), 123_456_789, 123_400_000);
    let srec = sync.encode().expect("valid sync");
    c.bench_function("offset_sync_encode", |b| {
        b.iter(|| black_box(&sync).encode())
    });
    c.bench_function("offset_sync_decode", |b| {
        b.iter(|| OffsetSync::decode(black_box(&srec.key), black_box(&srec.value)))
    });
}

/// A partition with a full store: 10k syncs, a delta change every 7th, so 64 runs retained.
fn full_store(origin: SyncOrigin) -> OffsetSyncStore {
    let mut store = OffsetSyncStore::new(StoreConfig::default());
    store.finish_initial_load();
    let tp = TopicPartition::new("orders", 0);
    for i in 0..10_000_i64 {
        let sync = OffsetSync::new(tp.clone(), i * 100, i * 100 + i / 7);
        store.update(&sync, origin).expect("non-negative sync");
    }
    store
}

fn translation(c: &mut Criterion) {
    let tp = TopicPartition::new("orders", 0);
    for (name, origin) in [("dense", SyncOrigin::Dense), ("sparse", SyncOrigin::Sparse)] {
        let store = full_store(origin);
        let mut committed = 0_i64;
        c.bench_function(&format!("translate_{name}"), |b| {
            b.iter(|| {
                // Spread lookups over the whole retained range, near head and far behind.
                committed = (committed + 7_919) % 1_000_000;
                black_box(store.translate(&tp, black_box(committed)))
            })
        });
    }
}

fn store_update(c: &mut Criterion) {
    let tp = TopicPartition::new("orders", 0);
    for (name, origin) in [("dense", SyncOrigin::Dense), ("sparse", SyncOrigin::Sparse)] {
        c.bench_function(&format!("store_update_full_{name}"), |b| {
            b.iter_batched_ref(
                || (full_store(origin), 1_000_000_i64),
                |(store, next)| {
                    // 100 syncs into a full partition: each one evicts a run.
                    for _ in 0..100 {
                        *next += 100;
                        let sync = OffsetSync::new(tp.clone(), *next, *next + *next / 700);
                        store.update(&sync, origin).expect("non-negative sync");
                    }
                },
                BatchSize::LargeInput,
            )
        });
    }
}

fn sync_policy(c: &mut Criterion) {
    let mut policy = SyncPolicy::new(
        TopicPartition::new("orders", 0),
        SyncPolicyConfig::default(),
    );
    let mut up = 0_i64;
    c.bench_function("sync_policy_observe", |b| {
        b.iter(|| {
            up += 1;
            black_box(policy.observe(up, up + 10, Duration::from_micros(up as u64)))
        })
    });
}

fn filters(c: &mut Criterion) {
    let filters = Filters::mm2_defaults();
    let policy = PrefixPolicy::default();
    c.bench_function("topic_decision", |b| {
        b.iter(|| {
            filters.topic_decision(
                &policy,
                black_box("secondary.orders-eu"),
                "secondary",
                "primary",
            )
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = records, translation, store_update, sync_policy, filters
}
criterion_main!(benches);
