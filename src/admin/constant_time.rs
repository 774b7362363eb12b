//! Secrets compared in time that depends on their length only, so that a
//! guess learns nothing from how long it took to be refused.

/// Whether `candidate` is `expected`.
pub(crate) fn same(expected: &[u8], candidate: &[u8]) -> bool {
    expected.len() == candidate.len()
        && expected
            .iter()
            .zip(candidate)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}
