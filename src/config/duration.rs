//! Durations as users write them: an integer and a unit ("250ms", "1s", "15m").

use std::time::Duration;

pub(super) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("\"{text}\" has no unit; write e.g. \"{text}s\" or \"{text}ms\""))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| {
        format!("\"{text}\" is not a duration like \"250ms\", \"1s\", \"15m\", \"1h\"")
    })?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "\"{text}\" is not a duration like \"250ms\", \"1s\", \"15m\", \"1h\" (units: ms, s, m, h, d)"
            ))
        }
    };
    number
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("\"{text}\" is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_refuses_nonsense() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse("10").unwrap_err().contains("no unit"));
        assert!(parse("1.5s").unwrap_err().contains("is not a duration"));
        assert!(parse("s").is_err());
        assert!(parse("5 fortnights").is_err());
        assert!(parse("99999999999999999999d").is_err());
    }
}
