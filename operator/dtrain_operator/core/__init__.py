"""The pure core, shared by the operator and `dtrain run`: what pods a job gets (render), what an exit means (policy), what to do next (plan). Imports only the API layer."""
