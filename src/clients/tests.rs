use std::sync::Arc;

use super::*;

fn entry(tier: Option<&str>, label: Option<&str>) -> KeyEntry {
    KeyEntry {
        tier: tier.map(Arc::from),
        set_at: 1_700_000_000,
        label: label.map(|l| l.into()),
    }
}

fn tables() -> Tables {
    Tables {
        keys: Arc::default(),
        overrides: Arc::default(),
        checker: Arc::default(),
    }
}

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "floodgate-clients-unit-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[test]
fn entries_read_back_as_written_and_bad_ones_are_refused() {
    for e in [entry(Some("pro"), Some("customer-42")), entry(None, None)] {
        let json = StoredEntry::to_json(&e);
        assert_eq!(StoredEntry::from_json(json.as_bytes()).expect("reads"), e);
    }
    assert!(StoredEntry::from_json(br#"{"set_at":1}"#).is_err());
    assert!(StoredEntry::from_json(br#"{"tier":"pro","revoked":true,"set_at":1}"#).is_err());
    assert!(parse_hash("abc").is_err());
    assert_eq!(
        parse_hash(&hash_hex(u128::MAX - 7)).expect("hex"),
        u128::MAX - 7
    );
}

#[tokio::test]
async fn the_file_keeps_every_change_and_a_new_process_loads_it() {
    let dir = dir();
    let path = dir.join("clients.json");
    let first =
        RunTimeClients::local(tables(), Some(path.clone())).expect("no file yet is no entry");
    assert!(first.keys.is_empty());
    first
        .set(vec![
            (1, entry(Some("pro"), Some("a"))),
            (2, entry(Some("free"), None)),
        ])
        .await
        .expect("set");
    first
        .set(vec![(2, entry(None, None))])
        .await
        .expect("revoke");
    assert!(!path.with_extension("json.tmp").exists());

    let second = RunTimeClients::local(tables(), Some(path.clone())).expect("load");
    let mut loaded = second.keys.entries();
    loaded.sort_by_key(|(h, _)| *h);
    assert_eq!(
        loaded,
        vec![(1, entry(Some("pro"), Some("a"))), (2, entry(None, None))]
    );

    std::fs::write(&path, b"{not json").expect("write");
    let refused = RunTimeClients::local(tables(), Some(path));
    assert!(matches!(refused, Err(LoadError::Parse { .. })));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_file_that_cannot_be_written_changes_nothing() {
    let dir = dir().join("gone");
    let clients =
        RunTimeClients::local(tables(), Some(dir.join("clients.json"))).expect("no file yet");
    let refused = clients.set(vec![(1, entry(Some("pro"), None))]).await;
    assert!(matches!(refused, Err(ClientsError::File { .. })));
    assert!(clients.keys.is_empty());
}

#[tokio::test]
async fn overrides_are_kept_in_the_file_beside_the_keys_and_removals_too() {
    use floodgate_policy::overrides::{Override, OverrideKey};
    let dir = dir().join("overrides");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("clients.json");
    let first = RunTimeClients::local(tables(), Some(path.clone())).expect("no file yet");
    let entry = |capacity: u64| Override {
        limit_name: Arc::from("per-account"),
        // No configuration reads it here: kept all the same.
        rule: Err("no limit".into()),
        numbers: format!("{{\"capacity\":{capacity},\"refill_rate\":10}}").into(),
        expires_at_s: Some(2_000_000_000),
        set_at_s: 1_700_000_000,
        client: "ip=203.0.113.7".into(),
        label: Some("launch".into()),
    };
    let key = |identity| OverrideKey { limit: 9, identity };
    first
        .set_overrides(vec![(key(1), Some(entry(50))), (key(2), Some(entry(60)))])
        .await
        .expect("set");
    first
        .set(vec![(7, entry_of_key())])
        .await
        .expect("a key too");
    first
        .set_overrides(vec![(key(2), None)])
        .await
        .expect("removed");
    let second = RunTimeClients::local(tables(), Some(path)).expect("load");
    let loaded = second.overrides.entries();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].0, key(1));
    assert_eq!(
        StoredOverride::of(&loaded[0].1),
        StoredOverride::of(&entry(50))
    );
    assert!(loaded[0].1.rule.is_err(), "no limit of that name here");
    assert_eq!(second.keys.len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

fn entry_of_key() -> KeyEntry {
    entry(Some("pro"), None)
}
