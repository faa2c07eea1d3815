//! `strftime_now`: the current time (UTC) formatted with C's strftime directives.

#[cfg(target_arch = "wasm32")]
use minijinja::ErrorKind;
use std::fmt::Write as _;

/// transformers' `strftime_now(format)`: the current time formatted with C's strftime. Here
/// the time is UTC, and the common directives are supported (`%Y %y %m %d %e %j %H %I %M %S
/// %p %a %A %b %B %h %F %T %D %R %%`); another directive is kept as written.
pub(super) fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Ok(strftime_utc(&format, secs))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = format;
        Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "strftime_now: the current time is not available in the browser build",
        ))
    }
}

/// `format` applied to the UTC time `secs` seconds after the Unix epoch.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn strftime_utc(format: &str, secs: i64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (hour, minute, second) = (tod / 3600, tod % 3600 / 60, tod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'j' => write!(out, "{yday:03}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'a' => write!(out, "{}", &DAYS[weekday][..3]),
            'A' => write!(out, "{}", DAYS[weekday]),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'B' => write!(out, "{month_name}"),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'R' => write!(out, "{hour:02}:{minute:02}"),
            'D' => write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_strftime_utc_known_dates() {
        // 2026-02-17 13:05:09 UTC was a Tuesday, day 48 of the year.
        let t = 1_771_333_509;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I%p %%", t),
            "2026-02-17 13:05:09 Tue Tuesday Feb February 048 26 01PM %"
        );
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        // A leap day.
        assert_eq!(strftime_utc("%F %j", 951_782_400), "2000-02-29 060");
        assert_eq!(strftime_utc("%Q|%", 0), "%Q|%");
    }
}
