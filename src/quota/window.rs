//! placeholder until the window module lands
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    Minute,
    Minutes(u32),
    Day,
    Month,
    Total,
}
impl std::str::FromStr for Window {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "minute" => Ok(Window::Minute),
            "day" => Ok(Window::Day),
            "month" => Ok(Window::Month),
            "total" => Ok(Window::Total),
            _ => {
                let n: u32 = s
                    .strip_suffix("minutes")
                    .and_then(|n| n.parse().ok())
                    .ok_or(format!("bad window {s:?}"))?;
                if n == 0 || 1440 % n != 0 {
                    return Err(format!("bad window {s:?}: N must divide 1440"));
                }
                Ok(Window::Minutes(n))
            }
        }
    }
}
impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Window::Minute => f.write_str("minute"),
            Window::Minutes(n) => write!(f, "{n}minutes"),
            Window::Day => f.write_str("day"),
            Window::Month => f.write_str("month"),
            Window::Total => f.write_str("total"),
        }
    }
}
