"""The httpx the SDKs use: ``httpx2`` (the official OpenAI and Anthropic SDKs since they moved to
it), else the classic ``httpx``. Nothing else is needed: the SDK brings it."""

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on what the SDK installed
    try:
        import httpx  # type: ignore[no-redef]
    except ImportError as e:
        raise ImportError(
            "aigw_client needs httpx2 or httpx, which the openai and anthropic SDKs install"
        ) from e

__all__ = ["httpx"]
