// ESLint's flat config for the views' sources (scripts/check_ui.sh runs it where build_ui.sh installs the
// packages): JavaScript's recommended rules, React's rules of hooks, the browser's globals, JSX as is.
import js from "@eslint/js";
import reactHooks from "eslint-plugin-react-hooks";
import globals from "globals";

export default [
  { ignores: ["dist/", "node_modules/"] },
  js.configs.recommended,
  reactHooks.configs.flat.recommended,
  {
    files: ["**/*.{js,jsx}"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      parserOptions: { ecmaFeatures: { jsx: true } },
      globals: globals.browser,
    },
  },
  // The tests and the build's own configuration run in Node.
  { files: ["test/**", "*.config.js"], languageOptions: { globals: globals.node } },
];
