// Airflow's UI imports this bundle for each React app of the plugin (plugins/training.py) and renders
// the function found on globalThis under the app's name, inside its own React tree: so the views get
// Airflow's React, fonts and theme. Both apps share this one bundle, so each name is set here (the UI
// would otherwise take globalThis.AirflowPlugin, which only the first import sets).
import { HistoryView } from "./HistoryView.jsx";
import { TrainingView } from "./TrainingView.jsx";

globalThis["Training"] = TrainingView;
globalThis["Training history"] = HistoryView;
globalThis.AirflowPlugin = TrainingView;
