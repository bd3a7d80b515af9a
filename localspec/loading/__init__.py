"""What to load and how: turning the user's words into a running target/draft pair.

`defaults` names the embedded models and the cache; `presets` reads the preset files of
`models/`; `hub` finds or downloads files on Hugging Face; `vocab` checks that a draft speaks the
target's vocabulary; `session` loads the pair and its drafter; `warmstart` keeps what the k
controller learned per machine and pair between runs, and `record_view` tells what doctor shows
of it; `controllers` is the one place a k controller is made for a session, a drafter and a
temperature (warm start and k_max included).

May import: the engine, the algorithm (`localspec.decoding`) and the top-level modules. Must never
import the CLI, the server, bench, doctor, saved chats or the UI: every command builds on this.
"""
