// Starts Swagger UI on /docs from a file, since the Content-Security-Policy allows no inline script.
// The page is reached after logging in to the dashboard: the session cookie authorizes /openapi.json
// and the "Try it out" calls.
window.ui = window.SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  presets: [window.SwaggerUIBundle.presets.apis],
});
