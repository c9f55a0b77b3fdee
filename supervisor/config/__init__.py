"""The supervisor's TOML configuration: loaded, checked, explained.

Every key is declared once, as a row (`schema.Key`: reader, default, scope, one line of
doc); the loader, the dataclasses, the errors and docs/configuration.md come from the
rows.

| module | what it is |
| --- | --- |
| `load` | `load_config`: the file into a checked `Config`; `ConfigError` names file and key; `TABLES` |
| `schema` | the row (`Key`, declared on a dataclass field by `key()`) and reading a table by its rows |
| `fields` | one reader per kind of value (durations, sizes, rates, …) |
| `queues` | `[[queue]]`: the queues this supervisor serves |
| `redis_table` | `[redis]`: where Redis is, its password (env or file, never the TOML) |
| `sandbox` | `[sandbox]`: what each child gives up before its handler runs |
| `schedules` | `[[schedule]]`: cron expressions, time zones, catch-up |
| `reference` | `python -m forq.supervisor.config.reference`: the reference page, from the rows |
"""
