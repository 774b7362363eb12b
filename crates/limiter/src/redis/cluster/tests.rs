use super::{not_whole, pongs};
use redis::Value;

const WHOLE: &str = "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:6\r\n";

#[test]
fn a_cluster_is_whole_only_when_no_slot_has_a_failing_master() {
    assert_eq!(not_whole(WHOLE), None);
    let suspected = WHOLE.replace("cluster_slots_pfail:0", "cluster_slots_pfail:5461");
    assert_eq!(
        not_whole(&suspected).as_deref(),
        Some("cluster_slots_pfail is 5461")
    );
    let failed = WHOLE
        .replace("cluster_state:ok", "cluster_state:fail")
        .replace("cluster_slots_fail:0", "cluster_slots_fail:5461");
    assert_eq!(not_whole(&failed).as_deref(), Some("cluster_state is fail"));
    // Without full coverage required, the state stays ok.
    let partial = WHOLE.replace("cluster_slots_fail:0", "cluster_slots_fail:5461");
    assert_eq!(
        not_whole(&partial).as_deref(),
        Some("cluster_slots_fail is 5461")
    );
    assert_eq!(
        not_whole("cluster_state:ok\r\n").as_deref(),
        Some("cluster_slots_fail is missing")
    );
}

#[test]
fn only_a_pong_counts_as_a_master_answering() {
    let address = |a: &str| Value::BulkString(a.as_bytes().to_vec());
    let replies = Value::Map(vec![
        (
            address("127.0.0.1:7000"),
            Value::SimpleString("PONG".into()),
        ),
        (
            address("127.0.0.1:7001"),
            Value::SimpleString("LOADING".into()),
        ),
        (
            address("127.0.0.1:7002"),
            Value::SimpleString("PONG".into()),
        ),
    ]);
    assert_eq!(pongs(&replies), 2);
    assert_eq!(pongs(&Value::SimpleString("PONG".into())), 1);
    assert_eq!(pongs(&Value::Nil), 0);
}
