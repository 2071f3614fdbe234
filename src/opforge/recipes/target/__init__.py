"""``derive``'s side inside the environment under test: ``trial`` runs the calls the search
proposes. Like the smoke probe it imports the standard library, torch and the probe
(``opforge.smoke.probe``) only: ``opforge.smoke.archive`` ships it with the probe."""
