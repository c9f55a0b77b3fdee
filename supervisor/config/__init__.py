"""The supervisor's TOML configuration: loaded, checked, explained.

| module | what it is |
| --- | --- |
| `load` | `load_config`: the file into a checked `Config`; `ConfigError` names file and key |
| `fields` | one reader per kind of value (durations, sizes, rates, …) |
| `redis_table` | `[redis]`: where Redis is, its password (env or file, never the TOML) |
| `sandbox` | `[sandbox]`: what each child gives up before its handler runs |
| `schedules` | `[[schedule]]`: cron expressions, time zones, catch-up |
"""
