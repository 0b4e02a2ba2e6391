//! The fence against a real etcd (Debian's etcd-server), started by each
//! test on loopback or inside a test network namespace.

use ferry_fence::{Claim, Fence, FenceError, Owner};
use ferry_testkit::{require_etcd, require_root, EtcdWitness, NetNs};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(1000);

fn fence(endpoint: &str) -> Fence {
    Fence::connect(&[endpoint.to_string()], TIMEOUT)
        .unwrap_or_else(|e| panic!("connecting to {endpoint}: {e}"))
}

fn won(epoch: u64) -> Claim {
    Claim::Won { epoch }
}

fn holder_of(claim: &Claim) -> Option<(String, u64)> {
    match claim {
        Claim::Lost { owner } => Some((owner.holder.clone(), owner.epoch)),
        Claim::Won { .. } => None,
    }
}

#[test]
fn the_first_claim_wins_epoch_1_and_a_second_holder_loses() {
    require_etcd!();
    let etcd = EtcdWitness::on_loopback("first");
    let f = fence(&etcd.endpoint());
    assert_eq!(f.owner("svc").unwrap(), None);
    assert_eq!(f.claim_initial("svc", "host-a").unwrap(), won(1));
    let owner = f.owner("svc").unwrap().expect("an owner after the claim");
    assert_eq!((owner.holder.as_str(), owner.epoch), ("host-a", 1));
    assert!(owner.since_unix_ms > 1_600_000_000_000, "since_unix_ms {}", owner.since_unix_ms);
    // The holder claiming again (a restart) keeps its epoch; anyone else loses.
    assert_eq!(f.claim_initial("svc", "host-a").unwrap(), won(1));
    let lost = f.claim_initial("svc", "host-b").unwrap();
    assert_eq!(lost, Claim::Lost { owner: owner.clone() });
    // Services are independent.
    assert_eq!(f.claim_initial("other", "host-b").unwrap(), won(1));
    assert_eq!(f.owner("svc").unwrap(), Some(owner));
}

#[test]
fn of_two_racing_take_overs_at_one_epoch_exactly_one_wins() {
    require_etcd!();
    let etcd = EtcdWitness::on_loopback("race");
    let endpoint = etcd.endpoint();
    let (a, b) = (fence(&endpoint), fence(&endpoint));
    assert_eq!(a.claim_initial("race", "primary").unwrap(), won(1));
    let mut wins = [0u32; 2];
    for round in 1..=20u64 {
        let barrier = Arc::new(Barrier::new(2));
        let results: Vec<Claim> = std::thread::scope(|s| {
            let racers = [("host-a", &a), ("host-b", &b)].map(|(name, f)| {
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    f.take_over("race", name, round).unwrap()
                })
            });
            racers.into_iter().map(|h| h.join().expect("racer")).collect()
        });
        let winners: Vec<usize> = (0..2).filter(|&i| results[i] == won(round + 1)).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let w = winners[0];
        wins[w] += 1;
        let name = ["host-a", "host-b"][w];
        assert_eq!(holder_of(&results[1 - w]), Some((name.to_string(), round + 1)), "{results:?}");
        let stored = a.owner("race").unwrap().expect("owner");
        assert_eq!((stored.holder.as_str(), stored.epoch), (name, round + 1));
    }
    eprintln!("take-over races won: host-a {}, host-b {}", wins[0], wins[1]);
}

#[test]
fn a_take_over_from_a_stale_epoch_loses() {
    require_etcd!();
    let etcd = EtcdWitness::on_loopback("stale");
    let f = fence(&etcd.endpoint());
    assert_eq!(f.claim_initial("svc", "primary").unwrap(), won(1));
    // The standby takes over from epoch 1 ...
    assert_eq!(f.take_over("svc", "standby", 1).unwrap(), won(2));
    // ... and the old primary, which still believes in epoch 1, loses to it.
    let lost = f.take_over("svc", "primary", 1).unwrap();
    assert_eq!(holder_of(&lost), Some(("standby".into(), 2)));
    // A future epoch is stale too: only the stored one can be taken over.
    assert_eq!(holder_of(&f.take_over("svc", "primary", 7).unwrap()), Some(("standby".into(), 2)));
    // The standby retrying its own take-over (an answer lost to a timeout) keeps it.
    assert_eq!(f.take_over("svc", "standby", 1).unwrap(), won(2));
    // The primary catching up with epoch 2 may take it back, under epoch 3.
    assert_eq!(f.take_over("svc", "primary", 2).unwrap(), won(3));
    assert_eq!(holder_of(&f.take_over("svc", "standby", 2).unwrap()), Some(("primary".into(), 3)));
    // An owner renewing its own epoch moves it on (the primary that lost its standby).
    assert_eq!(f.take_over("svc", "primary", 3).unwrap(), won(4));
    // Nothing to take over: an error, not a claim.
    let err = f.take_over("never-claimed", "standby", 1).unwrap_err();
    assert!(matches!(err, FenceError::NotClaimed { .. }), "{err}");
    assert!(err.to_string().contains("/ferry/services/never-claimed/owner"), "{err}");
}

#[test]
fn only_the_owner_at_its_epoch_releases() {
    require_etcd!();
    let etcd = EtcdWitness::on_loopback("release");
    let f = fence(&etcd.endpoint());
    assert!(!f.release("svc", "primary", 1).unwrap(), "released what nobody claimed");
    assert_eq!(f.claim_initial("svc", "primary").unwrap(), won(1));
    assert_eq!(f.take_over("svc", "standby", 1).unwrap(), won(2));
    assert!(!f.release("svc", "primary", 1).unwrap(), "a former owner released");
    assert!(!f.release("svc", "primary", 2).unwrap(), "another holder released");
    assert!(!f.release("svc", "standby", 1).unwrap(), "an old epoch released");
    assert_eq!(f.owner("svc").unwrap().map(|o| o.epoch), Some(2));
    assert!(f.release("svc", "standby", 2).unwrap());
    assert_eq!(f.owner("svc").unwrap(), None);
    assert_eq!(f.claim_initial("svc", "primary").unwrap(), won(1));
}

/// Writes `value` at the owner key of `service` with a client of its own:
/// anyone with access to etcd can.
fn put_raw(endpoint: &str, service: &str, value: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None).await.unwrap();
        c.put(format!("/ferry/services/{service}/owner"), value, None).await.unwrap();
    });
}

#[test]
fn a_foreign_value_at_the_owner_key_is_an_error_naming_it() {
    require_etcd!();
    let etcd = EtcdWitness::on_loopback("hostile");
    let f = fence(&etcd.endpoint());
    let key = "/ferry/services/svc/owner";
    for bad in
        [&b"not json"[..], b"{\"holder\":\"x\",\"epoch\":0,\"since_unix_ms\":1}", &[0xff; 5000]]
    {
        put_raw(&etcd.endpoint(), "svc", bad);
        let errors = [
            f.owner("svc").map(|_| ()).unwrap_err(),
            f.claim_initial("svc", "a").map(|_| ()).unwrap_err(),
            f.take_over("svc", "a", 1).map(|_| ()).unwrap_err(),
            f.release("svc", "a", 1).map(|_| ()).unwrap_err(),
        ];
        for e in errors {
            assert!(matches!(e, FenceError::BadRecord { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains(key) && text.contains(&etcd.endpoint()), "{text}");
        }
    }
    // Bad names never reach etcd: a '/' would address another service's key.
    let e = f.claim_initial("a/../b", "a").unwrap_err();
    assert!(matches!(e, FenceError::Usage(_)) && e.to_string().contains("a/../b"), "{e}");
    assert!(matches!(f.take_over("svc", "", 1), Err(FenceError::Usage(_))));
    assert!(matches!(f.take_over("svc", "a", u64::MAX), Err(FenceError::Usage(_))));
}

/// Runs `op` and checks that it fails with an error naming the endpoint
/// within twice the timeout.
fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    endpoint: &str,
    op: impl FnOnce() -> Result<T, FenceError>,
) -> FenceError {
    let start = Instant::now();
    let result = op();
    let took = start.elapsed();
    let err = result.expect_err(what);
    eprintln!("{what}: {} ms: {err}", took.as_millis());
    assert!(took < 2 * TIMEOUT, "{what} took {took:?} (timeout {TIMEOUT:?}): {err}");
    assert!(err.to_string().contains(endpoint), "{what}: {err}");
    err
}

#[test]
fn with_etcd_down_every_operation_fails_within_the_timeout() {
    require_etcd!();
    let mut etcd = EtcdWitness::on_loopback("down");
    let endpoint = etcd.endpoint();
    let f = fence(&endpoint);
    assert_eq!(f.claim_initial("svc", "primary").unwrap(), won(1));

    // Killed: connections are refused.
    etcd.stop();
    fails_in_time("connect (stopped)", &endpoint, || {
        Fence::connect(std::slice::from_ref(&endpoint), TIMEOUT)
    });
    fails_in_time("owner (stopped)", &endpoint, || f.owner("svc"));
    fails_in_time("take_over (stopped)", &endpoint, || f.take_over("svc", "standby", 1));
    fails_in_time("claim_initial (stopped)", &endpoint, || f.claim_initial("svc", "standby"));
    fails_in_time("release (stopped)", &endpoint, || f.release("svc", "primary", 1));

    // Back with its data: the same fence works again, and the record survived.
    etcd.start();
    assert_eq!(eventually(|| f.owner("svc")).map(|o| o.epoch), Some(1));

    // Frozen: connections stay open and nothing answers; the fence's own
    // deadline ends the wait (later, keep-alive finds the connection dead).
    etcd.pause();
    let err = fails_in_time("take_over (paused)", &endpoint, || f.take_over("svc", "standby", 1));
    assert!(matches!(err, FenceError::Timeout { .. }), "{err}");
    let err = fails_in_time("connect (paused)", &endpoint, || {
        Fence::connect(std::slice::from_ref(&endpoint), TIMEOUT)
    });
    assert!(matches!(err, FenceError::Timeout { .. }), "{err}");
    fails_in_time("owner (paused)", &endpoint, || f.owner("svc"));
    etcd.resume();
    assert_eq!(eventually(|| f.take_over("svc", "standby", 1)), won(2));
}

#[test]
fn a_dead_endpoint_beside_a_live_one_is_passed_over() {
    require_etcd!();
    let etcd = EtcdWitness::on_loopback("endpoints");
    let mut gone = EtcdWitness::on_loopback("gone");
    gone.stop();
    let endpoints = [gone.endpoint(), etcd.endpoint()];
    let f = Fence::connect(&endpoints, TIMEOUT).unwrap_or_else(|e| panic!("{endpoints:?}: {e}"));
    for i in 0..10 {
        assert_eq!(f.claim_initial(&format!("svc{i}"), "primary").unwrap(), won(1));
    }
    // A frozen member costs its share of the timeout, once: the member
    // that answered is asked first from then on.
    let frozen = EtcdWitness::on_loopback("frozen");
    frozen.pause();
    let start = Instant::now();
    let f2 = Fence::connect(&[frozen.endpoint(), etcd.endpoint()], TIMEOUT).unwrap();
    assert!(start.elapsed() < TIMEOUT, "connect took {:?}", start.elapsed());
    let start = Instant::now();
    assert_eq!(f2.owner("svc0").unwrap().map(|o| o.epoch), Some(1));
    assert!(start.elapsed() < TIMEOUT / 4, "owner took {:?}", start.elapsed());
    drop(frozen);
    // With none alive, the error names them all.
    drop(etcd);
    let err = fails_in_time("owner (all down)", &endpoints.join(","), || f.owner("svc0"));
    assert!(err.to_string().contains(&endpoints.join(",")), "{err}");
}

/// `op`'s first success within 10 s (a client reconnects after etcd came back).
fn eventually<T>(mut op: impl FnMut() -> Result<T, FenceError>) -> T {
    let start = Instant::now();
    loop {
        match op() {
            Ok(v) => return v,
            Err(e) if start.elapsed() > Duration::from_secs(10) => panic!("still failing: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The hosts of a replicated service: etcd on a witness host, the primary
/// and the standby each linked to it by a veth pair of their own.
#[test]
fn primary_and_standby_race_through_a_witness_host() {
    require_root!();
    require_etcd!();
    let witness = NetNs::new("fw").expect("ip netns add");
    let primary = NetNs::new("fp").expect("ip netns add");
    let standby = NetNs::new("fs").expect("ip netns add");
    witness.link("to-p", "10.77.1.1/30", &primary, "eth0", "10.77.1.2/30");
    witness.link("to-s", "10.77.2.1/30", &standby, "eth0", "10.77.2.2/30");
    let etcd = EtcdWitness::in_netns("netns", &witness, "10.77.1.1".parse().unwrap());
    let port = etcd.endpoint().rsplit(':').next().unwrap().to_string();
    let from_primary = etcd.endpoint();
    let from_standby = format!("http://10.77.2.1:{port}");

    // The standby cannot reach etcd through the primary's address: the
    // hosts are really apart (no route to 10.77.1.0/30 from the standby).
    let err =
        standby.run(|| Fence::connect(std::slice::from_ref(&from_primary), TIMEOUT).map(|_| ()));
    assert!(err.is_err(), "the standby reached the primary's link");

    let barrier = Barrier::new(2);
    let race = |ns: &NetNs, endpoint: &str, name: &str| {
        ns.run(|| {
            let f = fence(endpoint);
            let first = f.claim_initial("redis", name).unwrap();
            barrier.wait();
            let seen = match &first {
                Claim::Won { epoch } => *epoch,
                Claim::Lost { owner } => owner.epoch,
            };
            (first, f.take_over("redis", name, seen).unwrap())
        })
    };
    let (p, s) = std::thread::scope(|sc| {
        let p = sc.spawn(|| race(&primary, &from_primary, "primary"));
        let s = sc.spawn(|| race(&standby, &from_standby, "standby"));
        (p.join().expect("primary"), s.join().expect("standby"))
    });
    let firsts = [&p.0, &s.0].iter().filter(|c| ***c == won(1)).count();
    let seconds = [&p.1, &s.1].iter().filter(|c| ***c == won(2)).count();
    assert_eq!((firsts, seconds), (1, 1), "primary {p:?}, standby {s:?}");
    let owner: Option<Owner> = primary.run(|| fence(&from_primary).owner("redis").unwrap());
    let winner = if p.1 == won(2) { "primary" } else { "standby" };
    assert_eq!(owner.map(|o| (o.holder, o.epoch)), Some((winner.to_string(), 2)));
}
