//! The token shares' stored form in Redis (`share.lua` writes it, [`stored_use`] reads it back for
//! the standings): one hash field per group, as binary so that a decision's scan of the groups
//! waiting (a second hash of the same entries) decodes each in one call.

/// A group's entry as `share.lua` stores it: the byte 1 and seven little-endian doubles (current,
/// previous, window, queued, seen, weight, since), or the text form a hash may still hold
/// ([`crate::domain::token_share::GroupUse::decode`]). `None` for anything else, or a double that
/// is not a whole number from 0 to 2^53 (the script writes none).
pub(super) fn stored_use(bytes: &[u8]) -> Option<crate::domain::token_share::GroupUse> {
    use crate::domain::token_share::GroupUse;
    let Some((&1, doubles)) = bytes.split_first().filter(|_| bytes.len() == 57) else {
        return GroupUse::decode(std::str::from_utf8(bytes).ok()?);
    };
    let mut v = [0u64; 7];
    for (slot, chunk) in v.iter_mut().zip(doubles.chunks_exact(8)) {
        let d = f64::from_le_bytes(chunk.try_into().ok()?);
        if !(0.0..=9_007_199_254_740_992.0).contains(&d) || d.fract() != 0.0 {
            return None;
        }
        *slot = d as u64;
    }
    let [current, previous, window, queued, seen_ms, weight, since_ms] = v;
    Some(GroupUse { current, previous, window, queued, seen_ms, weight, since_ms })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::domain::token_share::GroupUse;

    fn packed(v: [f64; 7]) -> Vec<u8> {
        std::iter::once(1u8).chain(v.iter().flat_map(|d| d.to_le_bytes())).collect()
    }

    #[test]
    fn an_entry_reads_in_the_binary_form_and_in_the_text_form() {
        let u = GroupUse {
            current: 1_200,
            previous: 30,
            window: 29_944_000,
            queued: 2,
            seen_ms: 1_796_649_691_494,
            weight: 3,
            since_ms: 1_796_649_591_494,
        };
        let b = packed([1_200.0, 30.0, 29_944_000.0, 2.0, 1_796_649_691_494.0, 3.0, 1_796_649_591_494.0]);
        assert_eq!(stored_use(&b), Some(u));
        assert_eq!(stored_use(u.encode().as_bytes()), Some(u), "the text form");
        for bad in [-1.0, 0.5, f64::NAN, f64::INFINITY, 1e300] {
            assert_eq!(stored_use(&packed([bad, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])), None, "{bad}");
        }
        assert_eq!(stored_use(&b[..56]), None, "short");
        assert_eq!(stored_use(b"1 2 3"), None);
        assert_eq!(stored_use(b"+1 2 3 4 5 6 7"), None, "digits alone, as the script's pattern reads");
        assert_eq!(stored_use(&[0xff, 0xfe]), None);
    }
}
